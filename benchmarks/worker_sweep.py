"""Throughput and scaling efficiency at several worker counts: `make bench WORKERS=1,2,4,8,16`.

For each worker count N (one intra-op and one inter-op thread per worker, the seed CNN at 128
examples per replica, synthetic data) it runs, through benchmarks/mwms_scaling.py (the trainer's
own model, input pipeline, loop and gradient exchange):
- mgpu with the trainer's defaults (the exchange the cost model chooses per N);
- mgpu with every gradient all-reduced in float32 (`--gradient-exchange allreduce`);
and, when torch is installed, torchrun-style DDP over gloo on the same CNN
(benchmarks/torch_ddp_peer.py). Worker counts run interleaved and repeated; medians are kept.

Per N it reports examples/s, efficiency = ex/s(N) / (N x ex/s(1)), CPU ms per step and worker,
and the CPU bound = CPU per step of 1 worker / CPU per step per worker at N, which is what
efficiency can reach when the workers fill every core (it holds however busy the machine is).
Writes benchmarks/results/workers-<cores>cores.{json,md,png}, the machine described inside, so
figures from different machines sit side by side.

More workers than cores measure the sharing of cores, not scaling: such counts are refused
unless --oversubscribe.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

# (label, benchmark script, its extra arguments); torch's entry runs only when torch imports.
VARIANTS = [
    ("mgpu default", "mwms_scaling.py", []),
    ("mgpu allreduce float32", "mwms_scaling.py", ["--gradient-exchange", "allreduce"]),
    ("torch DDP gloo", "torch_ddp_peer.py", []),
]


def parse_counts(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4], with 1 added (efficiency is measured against one worker)."""
    try:
        counts = sorted({int(c) for c in text.split(",") if c.strip()} | {1})
    except ValueError:
        raise SystemExit(f"--workers: expected comma-separated worker counts, got {text!r}")
    if counts[0] < 1:
        raise SystemExit(f"--workers: counts must be at least 1, got {text!r}")
    return counts


def check_cores(counts: list[int], cores: int, oversubscribe: bool) -> None:
    """Refuse (or, with oversubscribe, warn about) counts above the machine's cores."""
    over = [n for n in counts if n > cores]
    if not over:
        return
    message = (f"{', '.join(map(str, over))} workers need as many cores; this machine has {cores}: "
               "throughput would measure cores shared between workers, not scaling")
    if not oversubscribe:
        raise SystemExit(f"--workers: {message} (--oversubscribe runs them anyway)")
    print(f"warning: {message}", file=sys.stderr, flush=True)


def torch_available() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def run_variant(script: str, extra: list[str], counts: list[int], repeats: int, steps: int) -> dict:
    argv = [sys.executable, str(HERE / script), "--workers", ",".join(map(str, counts)),
            "--repeats", str(repeats), "--steps", str(steps), "--warmup", str(max(3, steps // 5)), *extra]
    print(f"# {' '.join(argv[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(["nice", *argv], cwd=REPO, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_count(raw: dict, counts: list[int]) -> dict:
    """{N: examples/s, efficiency, CPU ms per step and worker, CPU bound} from a benchmark's summary."""
    one = raw["w1"]
    rows = {}
    for n in counts:
        w = raw[f"w{n}"]
        rows[str(n)] = {
            "examples_per_s": w["examples_per_s_median"],
            "efficiency": round(w["examples_per_s_median"] / (n * one["examples_per_s_median"]), 3),
            "cpu_ms_per_step": w["cpu_ms_per_step_median"],
            "cpu_bound": round(one["cpu_ms_per_step_median"] / w["cpu_ms_per_step_median"], 3),
            "examples_per_s_all": w["examples_per_s_all"],
        }
    return rows


def machine() -> dict:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "python": platform.python_version(),
            "load_at_start": round(os.getloadavg()[0], 2),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def sweep(counts: list[int], repeats: int, steps: int, oversubscribe: bool = False) -> dict:
    check_cores(counts, os.cpu_count() or 1, oversubscribe)
    result = {"machine": machine(), "counts": counts, "repeats": repeats, "steps": steps,
              "batch_per_replica": 128, "threads_per_worker": 1, "variants": {}, "raw": {}}
    for label, script, extra in VARIANTS:
        if script == "torch_ddp_peer.py" and not torch_available():
            continue
        raw = run_variant(script, extra, counts, repeats, steps)
        result["raw"][label] = raw
        result["variants"][label] = per_count(raw, counts)
    return result


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores; {m['date']}; load {m['load_at_start']} at start. "
             f"Seed CNN, 128 per replica, 1 thread per worker, {result['steps']} steps, "
             f"median of {result['repeats']}.", "",
             "| workers | " + " | ".join(result["variants"]) + " |",
             "|---|" + "---|" * len(result["variants"])]
    for n in result["counts"]:
        cells = []
        for rows in result["variants"].values():
            r = rows[str(n)]
            cells.append(f"{r['examples_per_s']:,.0f} ex/s, eff. {r['efficiency']:.2f}, "
                         f"CPU {r['cpu_ms_per_step']:.0f} ms/step (bound {r['cpu_bound']:.2f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = result["counts"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in result["variants"].items():
        ax.plot(counts, [rows[str(n)]["examples_per_s"] for n in counts], "o-", label=label)
    first = result["variants"]["mgpu default"]["1"]["examples_per_s"]
    ax.plot(counts, [n * first for n in counts], "k:", label="linear (mgpu default, 1 worker)")
    ax.set_xticks(counts)
    ax.set_xlabel(f"workers (one thread each; {result['machine']['cores']}-core machine)")
    ax.set_ylabel("examples / second")
    ax.set_title("Seed CNN, 128 examples per replica")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def stem(result: dict, results_dir: pathlib.Path) -> pathlib.Path:
    return results_dir / f"workers-{result['machine']['cores']}cores"


def write(result: dict, results_dir: pathlib.Path) -> list[pathlib.Path]:
    """The results as JSON and as the page's table (the plot is drawn apart, with matplotlib)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    named = stem(result, results_dir)
    paths = [named.with_suffix(".json"), named.with_suffix(".md")]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(markdown(result))
    return paths


def main(workers: str, quick: bool, results_dir: pathlib.Path, oversubscribe: bool = False,
         steps: int | None = None, repeats: int | None = None) -> None:
    counts = parse_counts(workers)
    default_repeats, default_steps = (1, 20) if quick else (3, 120)
    result = sweep(counts, repeats or default_repeats, steps or default_steps, oversubscribe)
    paths = write(result, results_dir)
    paths.append(stem(result, results_dir).with_suffix(".png"))
    plot(result, paths[-1])
    print(markdown(result))
    print("written: " + ", ".join(map(str, paths)))
