"""A PyTorch DDP program (gloo, CPU): a small linear model trained for HOLD seconds, or until the
file HOLD exists. Every rank stops after the same step: the first to see the hold over tells the
others through an all-reduce.

Rank 0 hosts the rendezvous store on the first member's port; the other ranks dial it and listen on
no port of their own. Usage: python torch_ddp.py HOLD_SECONDS|HOLD_FILE [WORK]

With WORK, each step computes WORK products of 128x128 matrices on one thread (a step that keeps a
core busy, so that a slow task makes the others wait for it) instead of sleeping between steps.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hold import hold_over  # beside this program

HOLD = sys.argv[1] if len(sys.argv) > 1 else "0"
WORK = int(sys.argv[2]) if len(sys.argv) > 2 else 0


def main() -> None:
    if WORK:
        torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from mgpu
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.monotonic()
    steps = 0
    while True:
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        stop = torch.tensor([float(hold_over(HOLD, started))])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
        if WORK:
            product = torch.randn(128, 128)
            for _ in range(WORK):
                product = torch.tanh(product @ product)
        else:
            time.sleep(0.2)
    print(f"rank {rank}: {steps} steps, loss {loss.item():.3f}", flush=True)
    # Every rank done before rank 0's store goes away: without it, rank 0 may abort at exit
    # ("terminate called without an active exception") while the others still talk to it.
    dist.barrier()
    dist.destroy_process_group()
    # Gloo's threads can still race the interpreter's teardown here (an abort after the last line,
    # about one run in ten on a loaded machine): this program's subject is mgpu, not that teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
