"""Launcher overhead: `mgpu launch --local 2` against two trainer processes started by hand.

Both run the same trainer with the same TF_CONFIG shape for a single training step, so the
wall time from start until every worker has finished covers start-up, cluster formation and
the first step. The ratio mgpu / by-hand is the launcher's overhead (goal: <= 1.05).

Usage: python benchmarks/launcher_overhead.py [--repeats N] [--json-out FILE]
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
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.host.ports import pick_free_ports  # noqa: E402

TRAINER_ARGS = ["--dataset", "synthetic", "--model", "cnn", "--train-steps", "1", "--eval-steps", "1",
                "--threads", "1"]


def by_hand(workdir: pathlib.Path) -> float:
    addresses = [f"127.0.0.1:{port}" for port in pick_free_ports(2)]
    start = time.perf_counter()
    procs = []
    for index in range(2):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        # The environment mgpu gives a task on a machine without GPUs; without CUDA_VISIBLE_DEVICES=""
        # TensorFlow spends a while probing for CUDA, which is not what this measures.
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, "-m", "launcher.trainer", *TRAINER_ARGS], cwd=workdir,
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [proc.wait(timeout=300) for proc in procs]
    elapsed = time.perf_counter() - start
    if codes != [0, 0]:
        raise SystemExit(f"hand-started workers failed: {codes}")
    return elapsed


def through_mgpu(workdir: pathlib.Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "launcher", "launch", "--local", "2", "--log-dir", str(workdir),
                           "--", *TRAINER_ARGS], cwd=workdir, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"mgpu launch failed: {done.stderr[-2000:]}")
    return elapsed


def measure(repeats: int) -> dict:
    hand, mgpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):  # interleaved, so drifting machine load hits both alike
            hand.append(by_hand(pathlib.Path(tmp)))
            mgpu.append(through_mgpu(pathlib.Path(tmp)))
    return {
        "by_hand_s": statistics.median(hand),
        "mgpu_s": statistics.median(mgpu),
        "ratio": statistics.median(mgpu) / statistics.median(hand),
        "by_hand_runs_s": hand,
        "mgpu_runs_s": mgpu,
        "repeats": repeats,
    }


def table(results: dict) -> str:
    return "\n".join([
        "| start of 2 workers to end of their first step | median wall time |",
        "|---|---|",
        f"| two processes started by hand | {results['by_hand_s']:.2f} s |",
        f"| mgpu launch --local 2 | {results['mgpu_s']:.2f} s |",
        f"| ratio (goal <= 1.05) | {results['ratio']:.3f} |",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-out", type=pathlib.Path)
    args = parser.parse_args()
    results = measure(args.repeats)
    print(table(results))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
