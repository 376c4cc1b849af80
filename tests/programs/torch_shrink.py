"""A PyTorch DDP program (gloo, CPU) that resumes at whatever size mgpu starts it: every rank joins
the process group that mgpu's variables describe, says its size and the planned one, loads the
checkpoint (model, optimizer, step) that rank 0 writes after every step (and reports with a
MGPU_CHECKPOINT line), and trains on: a step takes 0.2 s while FOLDER/slow exists, else 0.01 s.

Usage: python torch_shrink.py FOLDER STEPS   (FOLDER: one every host reads, for the checkpoint)
"""

import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

folder, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from mgpu
rank, world = dist.get_rank(), dist.get_world_size()
print(f"world {world} of {os.environ['MGPU_WORLD_SIZE_MAX']}, rank {rank}", flush=True)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
checkpoint = folder / "checkpoint.pt"
start = 0
if checkpoint.exists():
    state = torch.load(checkpoint)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]
print(f"start step {start}", flush=True)
for step in range(start + 1, total + 1):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()  # the gradients' all-reduce: every rank waits for every other
    optimizer.step()
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   folder / "checkpoint.tmp")
        os.replace(folder / "checkpoint.tmp", checkpoint)
        print(f"MGPU_CHECKPOINT {step}", flush=True)
    print(f"MGPU_PROGRESS {step}/{total}", flush=True)
    time.sleep(0.2 if (folder / "slow").exists() else 0.01)
dist.destroy_process_group()
print("done", flush=True)
