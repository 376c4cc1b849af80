"""Cost of the launcher as the cluster grows: planning, dry runs and supervision stay linear.

Usage: python benchmarks/cluster_size.py [--workers 10000] [--local 256] [--repeats 3] [--json-out FILE]

Measures, medians of --repeats runs:
- `mgpu tf-config --hostfile H --task-index N/2` for a hostfile of N workers: wall time and peak
  memory (goal: well under a second);
- `mgpu launch --hostfile H --dry-run --json` for N workers, written to /dev/null: wall time and
  peak memory (the document grows with N^2: it is streamed, so memory stays flat);
- `mgpu launch --local L -- true`: the CPU time (user + system) of the launcher process itself,
  not of its tasks (goal: at most 2 s for 256 tasks).
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

REPO = pathlib.Path(__file__).resolve().parent.parent
MGPU = [sys.executable, "-m", "launcher"]

# Runs `mgpu ARGS...` in this process and prints the process's own CPU time: its tasks are
# children and are not counted.
_SELF_CPU = """
import resource, sys
sys.argv = ["mgpu", *sys.argv[1:]]
from launcher.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
usage = resource.getrusage(resource.RUSAGE_SELF)
print("CPU", usage.ru_utime + usage.ru_stime, code, file=sys.stderr)
"""


def wall_and_peak(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident MB of one run of `argv`, its output thrown away."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def launcher_cpu(local: int, log_dir: str) -> float:
    done = subprocess.run([sys.executable, "-c", _SELF_CPU, "launch", "--local", str(local), "--log-dir", log_dir,
                           "--", "true"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    line = [l for l in done.stderr.splitlines() if l.startswith("CPU ")][-1]
    _, seconds, code = line.split()
    if code not in ("0", "None"):
        raise SystemExit(f"mgpu launch --local {local} failed: {done.stderr}")
    return float(seconds)


def median_of(runs: list[tuple[float, ...]], index: int) -> float:
    return round(statistics.median(run[index] for run in runs), 3)


def measure(workers: int = 10_000, local: int = 256, repeats: int = 3) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = pathlib.Path(tmp) / "hosts"
        hostfile.write_text("".join(f"node-{i}.example.com:2222\n" for i in range(workers)))
        tf_config = [wall_and_peak([*MGPU, "tf-config", "--hostfile", str(hostfile), "--task-index",
                                    str(workers // 2)]) for _ in range(repeats)]
        dry_run = [wall_and_peak([*MGPU, "launch", "--hostfile", str(hostfile), "--dry-run", "--json"])
                   for _ in range(repeats)]
        cpu = [launcher_cpu(local, str(pathlib.Path(tmp) / "runs")) for _ in range(repeats)]
    return {
        "workers": workers,
        "tf_config_s": median_of(tf_config, 0), "tf_config_peak_mb": median_of(tf_config, 1),
        "dry_run_json_s": median_of(dry_run, 0), "dry_run_json_peak_mb": median_of(dry_run, 1),
        "local_tasks": local, "launcher_cpu_s": round(statistics.median(cpu), 3), "launcher_cpu_runs_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument("--local", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    results = measure(args.workers, args.local, args.repeats)
    text = json.dumps(results)
    if args.json_out:
        pathlib.Path(args.json_out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
