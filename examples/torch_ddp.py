"""PyTorch DistributedDataParallel across workers, launched by mgpu, written as the multinode
program of pytorch/examples (distributed/ddp-tutorial-series) is: env:// initialisation, a
snapshot to resume from after a restart.

    mgpu launch --local 2 -- python examples/torch_ddp.py --epochs 10
    mgpu launch --workers h1:2222,h2:2222 --max-restarts 2 -- python3 torch_ddp.py --snapshot /shared/snap.pt

mgpu sets, for every chief and worker task, what `init_process_group()` reads from the environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: process 0 listens at its TF_CONFIG address) and
LOCAL_RANK, LOCAL_WORLD_SIZE (the tasks on the same host), as torchrun does. Tasks with GPUs use
NCCL and the GPU of their LOCAL_RANK among those CUDA_VISIBLE_DEVICES leaves them; others use gloo.

Process 0 writes the snapshot after every `--save-every` epochs; after a restart (`mgpu launch
--max-restarts N`) every process resumes from it. The snapshot path must be one every process
reads: the same file on this machine, a shared file system across hosts.

The global batch is `--batch-size` times the job's planned size (MGPU_WORLD_SIZE_MAX). A run that
goes on with fewer processes (`mgpu launch --min-hosts N` after a host is lost) keeps it: each
process adds up the gradients of MGPU_WORLD_SIZE_MAX / WORLD_SIZE batches before each optimizer
step, so the steps, the learning rate and the result are those of the planned size. Each snapshot
is reported with a MGPU_CHECKPOINT line, after which mgpu may restart the job to take back a host.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

def ddp_setup() -> torch.device:
    """Join the process group that the environment describes; this process's device."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        dist.init_process_group(backend="nccl")
        return torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend="gloo")
    return torch.device("cpu")


def synthetic_dataset(size: int, seed: int) -> TensorDataset:
    """y = x . w + noise, the same on every process (each reads its own shard of it)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, 20, generator=generator)
    weights = torch.randn(20, 1, generator=generator)
    return TensorDataset(inputs, inputs @ weights + 0.01 * torch.randn(size, 1, generator=generator))


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer,
                 save_every: int, snapshot_path: str, device: torch.device):
        self.global_rank = int(os.environ["RANK"])
        self.device = device
        self.model = model.to(device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        self.accumulate = accumulation(dist.get_world_size())
        if os.path.exists(snapshot_path):
            print(f"[RANK{self.global_rank}] loading snapshot", flush=True)
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"[RANK{self.global_rank}] Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor, step: bool) -> float:
        # Only the last batch of an optimizer step all-reduces: no_sync() keeps the others' gradients local.
        with contextlib.nullcontext() if step else self.model.no_sync():
            loss = F.mse_loss(self.model(source), targets)
            (loss / self.accumulate).backward()  # DDP all-reduces the gradients here
        if step:
            self.optimizer.step()
            self.optimizer.zero_grad()
        return loss.item()

    def _run_epoch(self, epoch: int) -> float:
        self.train_data.sampler.set_epoch(epoch)
        loss = 0.0
        batches = len(self.train_data)
        for i, (source, targets) in enumerate(self.train_data):
            step = (i + 1) % self.accumulate == 0 or i + 1 == batches
            loss = self._run_batch(source.to(self.device), targets.to(self.device), step)
        print(f"[RANK{self.global_rank}] Epoch {epoch} | Steps: {len(self.train_data)} | loss {loss:.6f}", flush=True)
        return loss

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "OPTIMIZER_STATE": self.optimizer.state_dict(),
                    "EPOCHS_RUN": epoch + 1}
        # Written whole, then renamed: a process stopped while saving leaves the last snapshot intact.
        partial = f"{self.snapshot_path}.partial"
        torch.save(snapshot, partial)
        os.replace(partial, self.snapshot_path)
        print(f"[RANK{self.global_rank}] Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)
        # mgpu takes back a host it went on without (--min-hosts) right after such a line.
        print(f"MGPU_CHECKPOINT {epoch + 1}", flush=True)

    def train(self, max_epochs: int) -> float | None:
        loss = None
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            if self.global_rank == 0 and (epoch % self.save_every == 0 or epoch == max_epochs - 1):
                self._save_snapshot(epoch)
        return loss


def accumulation(world_size: int) -> int:
    """Batches per optimizer step that keep the planned global batch on `world_size` processes."""
    planned = int(os.environ.get("MGPU_WORLD_SIZE_MAX", world_size))
    if planned % world_size:
        steps = max(1, round(planned / world_size))
        print(f"[RANK{dist.get_rank()}] {world_size} processes of {planned} planned: {steps} batches per step, "
              f"a global batch of {steps * world_size} batches in place of {planned}", flush=True)
        return steps
    return planned // world_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10, help="total epochs to train")
    parser.add_argument("--save-every", type=int, default=1, help="snapshot after every this many epochs")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size on each process")
    parser.add_argument("--dataset-size", type=int, default=2048)
    parser.add_argument("--snapshot", default="snapshot.pt", help="where process 0 writes the snapshot")
    args = parser.parse_args()

    device = ddp_setup()
    print(f"[RANK{dist.get_rank()}] joined: rank {dist.get_rank()} of {dist.get_world_size()}, "
          f"local rank {os.environ['LOCAL_RANK']}, pid {os.getpid()}", flush=True)
    dataset = synthetic_dataset(args.dataset_size, seed=1)
    train_data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts process 0's)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot, device)
    loss = trainer.train(args.epochs)
    checksum = sum(float(p.detach().double().sum()) for p in trainer.model.module.parameters())
    print(f"[RANK{dist.get_rank()}] done: epochs {args.epochs}, loss {loss}, weights sum {checksum:.10f}", flush=True)
    # Every rank done before process 0's store goes away: without it, process 0 may abort at exit
    # ("terminate called without an active exception") while the others still talk to it.
    dist.barrier()
    dist.destroy_process_group()
    # Gloo's threads can still race the interpreter's own teardown after this (torch 2.x on a
    # loaded machine: the same abort, once in tens of runs): leave without it, the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
