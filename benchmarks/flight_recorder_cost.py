"""What PyTorch's flight recorder costs a step: a 2-rank gloo DDP job (CPU, one thread a rank, a
tiny model, so that the collectives are most of a step) timed over many steps with the recorder's
buffer (TORCH_FR_BUFFER_SIZE=2000, as mgpu sets it) and without (0), the two runs interleaved.

Usage: python benchmarks/flight_recorder_cost.py [STEPS] [ROUNDS]
Prints each run's microseconds per step (rank 0's) and the median difference."""

import os
import socket
import statistics
import subprocess
import sys
import time

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3

RANK_PROGRAM = """
import sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)
def step():
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
for _ in range(100):
    step()
dist.barrier()
started = time.perf_counter()
for _ in range(int(sys.argv[1])):
    step()
took = time.perf_counter() - started
if dist.get_rank() == 0:
    print(took / int(sys.argv[1]) * 1e6)
dist.barrier()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(buffer: str) -> float:
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, str(STEPS)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port, "TORCH_FR_BUFFER_SIZE": buffer})
             for r in range(2)]
    out = [p.communicate(timeout=1800)[0] for p in procs]
    return float(out[0].strip())


def main() -> None:
    with_fr, without = [], []
    for _ in range(ROUNDS):
        without.append(run("0"))
        with_fr.append(run("2000"))
        print(f"without {without[-1]:.1f} us/step, with {with_fr[-1]:.1f} us/step", flush=True)
    diff = statistics.median(w - o for w, o in zip(with_fr, without))
    print(f"median: without {statistics.median(without):.1f}, with {statistics.median(with_fr):.1f} us/step; "
          f"difference {diff:+.1f} us/step ({STEPS} steps x {ROUNDS} rounds, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
