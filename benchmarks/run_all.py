"""Run every benchmark and write benchmarks/results/bench.{json,md} and scaling.png.

Usage: python benchmarks/run_all.py [--quick]
       python benchmarks/run_all.py --workers 1,2,4,8 [--quick]   (benchmarks/worker_sweep.py)

Measures CLI start-up, launcher overhead, throughput and scaling of the seed CNN through
`mgpu launch` (1 worker against 2, one intra-op and one inter-op thread each, 128 examples per
replica), a plain Keras model.fit baseline, a Keras 3 fit on the JAX backend at 1 and 2 workers
(benchmarks/keras_jax_fit.py), the gradient all-reduce on its own, and, when torch
is installed, torchrun-style DDP over gloo on the same CNN, and as root the start-up of `mgpu check`
and `mgpu launch` against the number of hosts (benchmarks/startup.py). The machine should be otherwise
idle: two workers on two cores are slowed by anything else that runs. The accuracy benchmark
(benchmarks/accuracy.py, real Fashion-MNIST) runs separately: `make bench-accuracy`.
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

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import cli_startup  # noqa: E402
import cluster_size  # noqa: E402
import launcher_overhead  # noqa: E402
import worker_sweep  # noqa: E402


def load() -> float:
    return round(os.getloadavg()[0], 2)


def mgpu_throughput(workers: int, steps: int) -> dict:
    """examples/sec of the built-in trainer under `mgpu launch --local N` (from its metrics.json)."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = pathlib.Path(tmp) / "model"
        before = load()
        subprocess.run([sys.executable, "-m", "launcher", "launch", "--local", str(workers),
                        "--threads-per-task", "1", "--log-dir", tmp, "--",
                        "--dataset", "synthetic", "--model", "cnn", "--batch-size-per-replica", "128",
                        "--train-steps", str(steps), "--log-every", str(steps), "--eval-steps", "1",
                        "--model-dir", str(model_dir)],
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
        metrics = json.loads((model_dir / "metrics.json").read_text())
    return {"examples_per_sec": metrics["examples_per_sec"], "load_before": before}


def throughput_and_scaling(repeats: int, steps: int) -> dict:
    runs = {1: [], 2: []}
    for _ in range(repeats):  # interleaved: drifting load hits both alike
        for workers in (1, 2):
            runs[workers].append(mgpu_throughput(workers, steps))
            print(f"# mgpu {workers} worker(s): {runs[workers][-1]}", file=sys.stderr, flush=True)
    medians = {n: statistics.median(r["examples_per_sec"] for r in rs) for n, rs in runs.items()}
    return {"w1_examples_per_sec": medians[1], "w2_examples_per_sec": medians[2],
            "scaling": medians[2] / (2 * medians[1]), "runs": {str(n): rs for n, rs in runs.items()},
            "steps": steps, "batch_per_replica": 128}


def run_json(argv: list[str], timeout: float = 3600) -> dict:
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def torch_available() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def markdown(results: dict) -> str:
    cli, overhead, mgpu = results["cli_startup"], results["launcher_overhead"], results["mgpu"]
    lines = ["| measure | value | goal |", "|---|---|---|"]
    if cli["ratio_256_vs_tensorflow"] is not None:
        lines.append(f"| dry run, 256 workers, vs `import tensorflow` | {cli['dry_run_256_workers_s'] * 1000:.0f} ms "
                     f"vs {cli['import_tensorflow_s'] * 1000:.0f} ms = {cli['ratio_256_vs_tensorflow']:.1%} | <= 10% |")
    size = results["cluster_size"]
    lines += [
        f"| `mgpu tf-config`, one task of {size['workers']:,} workers | {size['tf_config_s'] * 1000:.0f} ms, "
        f"{size['tf_config_peak_mb']:.0f} MB | well under 1 s |",
        f"| dry run JSON of {size['workers']:,} workers, streamed | {size['dry_run_json_s']:.1f} s, "
        f"{size['dry_run_json_peak_mb']:.0f} MB peak | memory flat |",
        f"| launcher CPU for `--local {size['local_tasks']} -- true` | {size['launcher_cpu_s']:.2f} s | <= 2 s |",
        f"| launcher overhead, start to first step of 2 workers | {overhead['mgpu_s']:.2f} s vs "
        f"{overhead['by_hand_s']:.2f} s by hand = {overhead['ratio']:.3f} | <= 1.05 |",
        f"| mgpu train, 1 worker | {mgpu['w1_examples_per_sec']:.0f} ex/s | |",
        f"| mgpu train, 2 workers | {mgpu['w2_examples_per_sec']:.0f} ex/s | |",
        f"| scaling efficiency | {mgpu['scaling']:.3f} | >= 0.85 |",
    ]
    keras_fit = results["keras_fit"]
    lines.append(f"| Keras model.fit, 1 process | {keras_fit['examples_per_sec']:.0f} ex/s; mgpu / fit = "
                 f"{mgpu['w1_examples_per_sec'] / keras_fit['examples_per_sec']:.2f} | >= 1.0 |")
    jax_fit = results["keras_jax_fit"]
    lines.append(f"| Keras 3 fit on JAX (examples/keras_jax_fit.py), 1 / 2 workers | "
                 f"{jax_fit['w1_examples_per_sec']:.0f} / {jax_fit['w2_examples_per_sec']:.0f} ex/s, "
                 f"scaling {jax_fit['scaling']:.3f} | |")
    allreduce = results.get("allreduce")
    if allreduce:
        lines.append(f"| gradient all-reduce alone (13.1 MB float32) | {allreduce['summary']} | |")
    peer = results.get("torch_ddp")
    if peer:
        lines.append(f"| torchrun-style DDP (gloo), 1 / 2 workers | {peer['w1']:.0f} / {peer['w2']:.0f} ex/s, "
                     f"scaling {peer['scaling']:.3f} | |")
        lines.append(f"| mgpu 2 workers / DDP 2 workers | {mgpu['w2_examples_per_sec'] / peer['w2']:.2f}x | >= 1.3x |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mgpu = results["mgpu"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([1, 2], [mgpu["w1_examples_per_sec"], mgpu["w2_examples_per_sec"]], "o-", label="mgpu (MWMS)")
    ax.plot([1, 2], [mgpu["w1_examples_per_sec"], 2 * mgpu["w1_examples_per_sec"]], "k:", label="linear scaling")
    peer = results.get("torch_ddp")
    if peer:
        ax.plot([1, 2], [peer["w1"], peer["w2"]], "s--", label="torch DDP (gloo)")
    ax.set_xticks([1, 2])
    ax.set_xlabel("workers (one thread each, 2-core machine)")
    ax.set_ylabel("examples / second")
    ax.set_title("Seed CNN, 128 examples per replica")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps, to check the pipeline")
    parser.add_argument("--workers", help="only the scaling sweep at these worker counts, e.g. 1,2,4,8,16 "
                                          "(writes results/workers-<cores>cores.{json,md,png})")
    parser.add_argument("--oversubscribe", action="store_true", help="with --workers: run counts above the cores")
    parser.add_argument("--steps", type=int, help="with --workers: timed steps per run")
    args = parser.parse_args()
    if args.workers:
        worker_sweep.main(args.workers, args.quick, RESULTS, args.oversubscribe, steps=args.steps)
        return
    repeats, steps = (1, 60) if args.quick else (3, 300)
    started = time.time()
    results = {"load_at_start": load()}
    results["cli_startup"] = cli_startup.measure(3 if args.quick else 7)
    results["cluster_size"] = cluster_size.measure(repeats=1 if args.quick else 3)
    results["launcher_overhead"] = launcher_overhead.measure(repeats)
    results["mgpu"] = throughput_and_scaling(repeats, steps)
    results["keras_fit"] = run_json([str(HERE / "keras_fit_baseline.py"), "--steps", str(steps)])
    results["keras_jax_fit"] = run_json([str(HERE / "keras_jax_fit.py"), "--repeats", str(repeats)])
    probe = run_json([str(HERE / "mwms_scaling.py"), "--probe", "allreduce", "--workers", "2",
                      "--repeats", str(repeats)])
    call = probe["w2"]["last_run"]
    wall_ms, mb = call["step_ms"], probe["config"]["probe_mb"]
    results["allreduce"] = {
        "megabytes": mb, "wall_ms": round(wall_ms, 1), "cpu_ms_per_worker": call["cpu_ms_per_step"],
        "algorithm_bandwidth_mb_s": round(mb / (wall_ms / 1000), 1), "raw": probe,
        "summary": f"{wall_ms:.0f} ms wall, {call['cpu_ms_per_step']:.0f} ms CPU per worker, "
                   f"{mb / (wall_ms / 1000):.0f} MB/s",
    }
    if torch_available():
        peer = run_json([str(HERE / "torch_ddp_peer.py"), "--repeats", str(repeats)])
        results["torch_ddp"] = {"w1": peer["w1"]["examples_per_s_median"], "w2": peer["w2"]["examples_per_s_median"],
                                "scaling": peer["scaling"], "raw": peer}
    if os.geteuid() == 0:  # hosts as network namespaces, each with its sshd: results/startup.json
        subprocess.run([sys.executable, str(HERE / "startup.py"),
                        *(["--hosts", "2,4", "--trainer-hosts", "2", "--repeats", "1"] if args.quick else [])],
                       cwd=REPO, check=True, timeout=3600)
    else:
        print("# benchmarks/startup.py skipped: it needs root (network namespaces, sshd)", file=sys.stderr)
    results["wall_time_s"] = round(time.time() - started, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (RESULTS / "bench.md").write_text(table)
    plot(results, RESULTS / "scaling.png")
    print(table)
    print(f"written: {RESULTS / 'bench.json'}, {RESULTS / 'bench.md'}, {RESULTS / 'scaling.png'}")


if __name__ == "__main__":
    main()
