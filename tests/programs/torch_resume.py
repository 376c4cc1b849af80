"""What pytorch/examples' imagenet/main.py does with --resume, cut to its bones: every rank joins
the process group (gloo, env://), then loads the checkpoint it was given. Given a file that is no
checkpoint, torch.load raises in every rank, after init_process_group, so torch.distributed's
excepthook writes the report with "[rankN]: " before each line.

Usage: python torch_resume.py CHECKPOINT
"""

import sys

import torch
import torch.distributed as dist


def main_worker(resume: str) -> None:
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from mgpu
    model = torch.nn.Linear(8, 1)
    print(f"=> loading checkpoint '{resume}'", flush=True)
    checkpoint = torch.load(resume, map_location="cpu")
    model.load_state_dict(checkpoint["state_dict"])


if __name__ == "__main__":
    main_worker(sys.argv[1])
