"""Accuracy benchmark: a 2-worker local cluster against one worker on real Fashion-MNIST.

Both runs go through `mgpu launch --local N` (fail-fast) and use the seed CNN, the same
global batch and the same number of steps, with the trainer's default gradient exchange
unless --gradient-exchange/--factor-dtype say otherwise. The 2-worker run must reach
--min-accuracy (0.91; the published figure for this network is 0.916) and stay within
--max-gap (0.005) of the single worker.

    python benchmarks/accuracy.py --data-dir ../shared/data/fashion-mnist

Prints both wall times and accuracies and writes benchmarks/results/accuracy.json.
Exits 1 if a criterion fails.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import signal
import sys
import tempfile
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "accuracy.json"
REPO = pathlib.Path(__file__).resolve().parents[1]
STOP_GRACE_S = 60


def run_cluster(workers: int, args: list[str], work: str, threads: int, timeout: float) -> dict:
    """Run `mgpu launch --local workers` (fail-fast) with the built-in trainer; return the
    chief's metrics.json. Stops the launch (which stops its tasks) after `timeout` seconds."""
    model_dir = os.path.join(work, f"{workers}-workers")
    os.makedirs(model_dir, exist_ok=True)
    command = [sys.executable, "-m", "launcher", "launch", "--local", str(workers),
               "--threads-per-task", str(threads), "--log-dir", os.path.join(work, "runs"),
               "--run-id", f"accuracy-{workers}-workers-{os.getpid()}",
               "--", *args, "--model-dir", model_dir]
    started = time.monotonic()
    with open(os.path.join(work, f"launch-{workers}-workers.log"), "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # the launcher stops its tasks and exits
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise SystemExit(f"{workers}-worker run did not finish in {timeout:.0f} s; "
                             f"logs in {work}") from None
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"{workers}-worker run failed (mgpu launch exit {code}); logs in {work}")
    with open(os.path.join(model_dir, "metrics.json")) as f:
        metrics = json.load(f)
    metrics["process_wall_time_s"] = round(wall, 1)
    metrics["threads_per_task"] = threads
    with open(os.path.join(work, f"launch-{workers}-workers.log")) as log:
        metrics["gradient_exchange"] = next(
            (line.split("gradient exchange: ", 1)[1].strip() for line in log
             if "gradient exchange: " in line), None)
    return metrics


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, help="the four Fashion-MNIST IDX .gz files")
    p.add_argument("--train-steps", type=int, default=3000)
    p.add_argument("--global-batch-size", type=int, default=256)
    p.add_argument("--min-accuracy", type=float, default=0.91)
    p.add_argument("--max-gap", type=float, default=0.005)
    p.add_argument("--gradient-exchange", default=None,
                   help="passed to the trainer (default: the trainer's)")
    p.add_argument("--factor-dtype", default=None, help="passed to the trainer (default: the trainer's)")
    p.add_argument("--timeout", type=float, default=5400, help="seconds allowed per run")
    p.add_argument("--work-dir", default=None, help="keep model dirs and logs here")
    p.add_argument("--output", default=str(RESULTS))
    opts = p.parse_args()

    work = opts.work_dir or tempfile.mkdtemp(prefix="mgpu-accuracy-")
    common = ["--dataset", "fashion_mnist", "--data-dir", os.path.abspath(opts.data_dir),
              "--model", "cnn", "--global-batch-size", str(opts.global_batch_size),
              "--train-steps", str(opts.train_steps), "--eval-every", "500", "--log-every", "100"]
    for name in ("gradient_exchange", "factor_dtype"):
        if getattr(opts, name) is not None:
            common += ["--" + name.replace("_", "-"), getattr(opts, name)]
    cores = os.cpu_count() or 1
    runs = {}
    for workers in (2, 1):
        # Share the cores out: each worker of the cluster gets its part.
        threads = max(1, cores // workers)
        print(f"running {workers} worker(s), {threads} thread(s) each ...", flush=True)
        runs[workers] = run_cluster(workers, common, work, threads, opts.timeout)
        m = runs[workers]
        print(f"  {workers} worker(s): accuracy {m['accuracy']:.4f}  wall {m['wall_time_s']:.0f} s  "
              f"{m['examples_per_sec']:.0f} examples/s", flush=True)

    two, one = runs[2], runs[1]
    gap = one["accuracy"] - two["accuracy"]
    passed = two["accuracy"] >= opts.min_accuracy and abs(gap) <= opts.max_gap
    result = {
        "dataset": "fashion_mnist", "model": "cnn", "global_batch_size": opts.global_batch_size,
        "train_steps": opts.train_steps, "cores": cores,
        "gradient_exchange": opts.gradient_exchange or "trainer default",
        "factor_dtype": opts.factor_dtype or "trainer default",
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "two_workers": two, "one_worker": one,
        "accuracy_gap": round(gap, 4), "min_accuracy": opts.min_accuracy,
        "max_gap": opts.max_gap, "passed": passed,
    }
    os.makedirs(os.path.dirname(opts.output), exist_ok=True)
    with open(opts.output, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"2 workers: accuracy {two['accuracy']:.4f}, wall {two['wall_time_s']:.0f} s | "
          f"1 worker: accuracy {one['accuracy']:.4f}, wall {one['wall_time_s']:.0f} s | "
          f"gap {gap:+.4f} -> {'PASS' if passed else 'FAIL'} (written to {opts.output})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
