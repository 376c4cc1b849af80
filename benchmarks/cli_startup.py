"""CLI start-up: `mgpu launch --dry-run --json` for 2 and 256 workers, against `import tensorflow`.

Usage: python benchmarks/cli_startup.py [--repeats N] [--json-out FILE]
Goal: at 256 workers, at most 10% of TensorFlow's import time.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

MGPU = [sys.executable, "-m", "launcher"]


def median_seconds(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def dry_run_argv(workers: int) -> list[str]:
    hosts = ",".join(f"node-{i}:2222" for i in range(workers))
    return [*MGPU, "launch", "--workers", hosts, "--dry-run", "--json"]


def measure(repeats: int) -> dict:
    results = {
        "dry_run_2_workers_s": median_seconds(dry_run_argv(2), repeats),
        "dry_run_256_workers_s": median_seconds(dry_run_argv(256), repeats),
    }
    try:
        results["import_tensorflow_s"] = median_seconds([sys.executable, "-c", "import tensorflow"], repeats)
        results["ratio_256_vs_tensorflow"] = results["dry_run_256_workers_s"] / results["import_tensorflow_s"]
    except subprocess.CalledProcessError:
        results["import_tensorflow_s"] = None  # TensorFlow is not installed here
        results["ratio_256_vs_tensorflow"] = None
    results["repeats"] = repeats
    return results


def table(results: dict) -> str:
    tf = results["import_tensorflow_s"]
    rows = [("mgpu launch --dry-run --json, 2 workers", results["dry_run_2_workers_s"]),
            ("mgpu launch --dry-run --json, 256 workers", results["dry_run_256_workers_s"]),
            ("python -c 'import tensorflow'", tf)]
    lines = ["| command | median wall time | vs import tensorflow |", "|---|---|---|"]
    for name, seconds in rows:
        shown = "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"
        ratio = "n/a" if seconds is None or not tf else f"{seconds / tf:.1%}"
        lines.append(f"| {name} | {shown} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json-out", type=pathlib.Path)
    args = parser.parse_args()
    results = measure(args.repeats)
    print(table(results))
    ratio = results["ratio_256_vs_tensorflow"]
    if ratio is not None:
        print(f"\n256-worker dry run = {ratio:.1%} of `import tensorflow` (goal: <= 10%)")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
