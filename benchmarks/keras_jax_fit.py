"""Keras 3 `fit` on the JAX backend through `mgpu launch --local N`: throughput at 1 and 2 workers.

Runs examples/keras_jax_fit.py with the seed CNN (conv 5x5x32, max-pool, conv 5x5x64, max-pool,
dense 1024, dropout, dense 10 on 28x28x1) at 128 examples per replica on synthetic data, one
thread per worker (XLA's CPU thread pool limited to one thread), 1 and 2 workers interleaved.
Prints one JSON object: the median examples/sec of each and the scaling ratio
w2 / (2 x w1). The examples/sec of a run is the one worker 0 reports, over every epoch but the
first (which compiles). Each run also records worker 0's CPU milliseconds per step (all its
threads: XLA's flag limits the compute pool, not JAX's and Keras's other threads, so one worker
alone uses more than one core and CPU time is no clean bound on scaling here). Wall figures need an
otherwise idle machine.

Usage: python benchmarks/keras_jax_fit.py [--repeats 3] [--steps-per-epoch 10] [--epochs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "keras_jax_fit.py"
# XLA's CPU backend otherwise runs each process's ops on a pool as wide as the machine.
ONE_THREAD = "XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def run_once(workers: int, steps_per_epoch: int, epochs: int) -> dict:
    """One `mgpu launch --local N` of the example; what worker 0 reported."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "launcher", "launch", "--local", str(workers), "--threads-per-task", "1",
                        "--env", ONE_THREAD, "--log-dir", tmp, "--run-id", "bench", "--",
                        sys.executable, str(EXAMPLE), "--model", "cnn", "--batch-size-per-replica", "128",
                        "--steps-per-epoch", str(steps_per_epoch), "--epochs", str(epochs)],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
        log = (pathlib.Path(tmp) / "bench" / "worker-0.log").read_text()
    result = [line for line in log.splitlines() if line.startswith("RESULT ")][-1]
    return json.loads(result[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.repeats):  # interleaved: drifting load hits both alike
        for workers in (1, 2):
            result = run_once(workers, args.steps_per_epoch, args.epochs)
            runs[workers].append({key: result[key] for key in ("examples_per_sec", "cpu_ms_per_step")})
            print(f"# keras jax fit, {workers} worker(s): {runs[workers][-1]}, load {os.getloadavg()[0]:.2f}",
                  file=sys.stderr, flush=True)
    wall = {n: statistics.median(r["examples_per_sec"] for r in rs) for n, rs in runs.items()}
    cpu = {n: statistics.median(r["cpu_ms_per_step"] for r in rs) for n, rs in runs.items()}
    print(json.dumps({"w1_examples_per_sec": wall[1], "w2_examples_per_sec": wall[2],
                      "scaling": wall[2] / (2 * wall[1]), "cpu_ms_per_step": {str(n): v for n, v in cpu.items()},
                      "runs": {str(n): r for n, r in runs.items()},
                      "batch_per_replica": 128, "steps_per_epoch": args.steps_per_epoch, "epochs": args.epochs}))

if __name__ == "__main__":
    main()
