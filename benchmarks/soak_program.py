"""The soak's training program: PyTorch DDP over gloo, as a user writes it, cut to what a soak needs.

Every rank joins the process group (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from mgpu), resumes
from the newest checkpoint any rank can read (sent to every rank from one that holds it), and trains
a small linear model on a seeded stream for TOTAL steps, each step an all-reduce of the gradients
(DDP) and STEP_SECONDS of "compute". Rank 0 checkpoints in FOLDER every CHECKPOINT_EVERY steps
(written beside, then renamed); with OWN_DISK, every rank checkpoints there instead (each host's own
disk: a spare that takes a lost host's place has none, and resumes from another rank's). Rank 0
writes the last step with its time to FOLDER/progress (the soak reads when a new attempt made its
first step). At the end every rank writes the SHA-256 of its weights to FOLDER/final-RANK: equal on
every rank, or the run did not end as one.

Usage: python soak_program.py FOLDER TOTAL [OWN_DISK]
"""

import datetime
import hashlib
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

CHECKPOINT_EVERY = 20
STEP_SECONDS = 0.1


def resume(model: torch.nn.Module, checkpoint: pathlib.Path) -> int:
    """The step of the newest checkpoint any rank holds (0: none), its weights sent to every rank
    from the first rank that holds it."""
    saved = torch.load(checkpoint, map_location="cpu") if checkpoint.exists() else None
    steps = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([saved["step"] if saved else 0]))
    holder = max(range(len(steps)), key=lambda r: (int(steps[r]), -r))
    if int(steps[holder]) == 0:
        return 0
    if dist.get_rank() == holder:
        model.load_state_dict(saved["model"])
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=holder)
    return int(steps[holder])


def main(folder: pathlib.Path, total: int, own_disk: pathlib.Path | None) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank = dist.get_rank()
    attempt = int(os.environ.get("MGPU_ATTEMPT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    checkpoints = own_disk or folder
    checkpoint = checkpoints / "checkpoint.pt"
    start = resume(model, checkpoint)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    print(f"rank {rank} attempt {attempt} resumes at step {start}", flush=True)
    for step in range(start + 1, total + 1):
        data = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=data)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(STEP_SECONDS)
        if step % CHECKPOINT_EVERY == 0 and (rank == 0 or own_disk):
            torch.save({"model": model.state_dict(), "step": step}, checkpoints / "checkpoint.tmp")
            (checkpoints / "checkpoint.tmp").replace(checkpoint)
        if rank == 0:
            (folder / "progress.tmp").write_text(f"{attempt} {step} {time.time():.3f}\n")
            (folder / "progress.tmp").replace(folder / "progress")
        print(f"MGPU_PROGRESS {step}/{total}", flush=True)
    weights = repr([p.detach().tolist() for p in model.parameters()]).encode()
    (folder / f"final-{rank}").write_text(hashlib.sha256(weights).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3]) if len(sys.argv) > 3 else None)
