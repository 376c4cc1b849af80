"""A PyTorch DDP program (gloo, CPU, a tiny model) whose last rank blocks in Python at step STEPS:
the others then wait for it in the next all-reduce. It runs torch's worker server
(worker_main), through which a rank's flight recorder is dumped from outside the process.

Usage: python torch_blocked_rank.py STEPS"""

import sys
import threading

import torch
import torch.distributed as dist
from torch.distributed.elastic.control_plane import worker_main
from torch.nn.parallel import DistributedDataParallel

STEPS = int(sys.argv[1])


def blocked_in_python() -> None:
    threading.Event().wait()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS + 1):
        if step == STEPS and rank == dist.get_world_size() - 1:
            print(f"rank {rank}: blocking", flush=True)
            blocked_in_python()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"rank {rank}: step {step}", flush=True)


if __name__ == "__main__":
    with worker_main():
        main()
