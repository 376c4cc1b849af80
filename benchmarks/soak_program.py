"""The soak's training program: PyTorch DDP over gloo, as a user writes it, cut to what a soak needs.

Every rank joins the process group (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from mgpu), resumes
from the checkpoint in FOLDER if there is one, and trains a small linear model on a seeded stream
for TOTAL steps, each step an all-reduce of the gradients (DDP) and STEP_SECONDS of "compute".
Rank 0 checkpoints every CHECKPOINT_EVERY steps (written beside, then renamed) and writes the
last step with its time to FOLDER/progress (the soak reads when a new attempt made its first
step). At the end every rank writes the SHA-256 of its weights to FOLDER/final-RANK: equal on
every rank, or the run did not end as one.

Usage: python soak_program.py FOLDER TOTAL
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


def main(folder: pathlib.Path, total: int) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank = dist.get_rank()
    attempt = int(os.environ.get("MGPU_ATTEMPT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    start = 0
    checkpoint = folder / "checkpoint.pt"
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu")
        model.load_state_dict(saved["model"])
        start = saved["step"]
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
        if rank == 0:
            if step % CHECKPOINT_EVERY == 0:
                torch.save({"model": model.state_dict(), "step": step}, folder / "checkpoint.tmp")
                (folder / "checkpoint.tmp").replace(checkpoint)
            (folder / "progress.tmp").write_text(f"{attempt} {step} {time.time():.3f}\n")
            (folder / "progress.tmp").replace(folder / "progress")
        print(f"MGPU_PROGRESS {step}/{total}", flush=True)
    weights = repr([p.detach().tolist() for p in model.parameters()]).encode()
    (folder / f"final-{rank}").write_text(hashlib.sha256(weights).hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), int(sys.argv[2]))
