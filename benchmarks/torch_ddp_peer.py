#!/usr/bin/env python3
"""Peer reference: the seed CNN under PyTorch DistributedDataParallel (gloo) on one host.

Runs 1 worker (plain loop) and 2 workers (torch.distributed.run --standalone, DDP over gloo),
interleaved and repeated, one intra-op and one inter-op thread per worker, synthetic 28x28x1
data at a fixed batch per worker, and prints one JSON object with examples/s (median), scaling
efficiency and CPU milliseconds per step per worker.

    python benchmarks/torch_ddp_peer.py --repeats 3

Only this benchmark needs torch; the product does not.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_accounting import cpu_by_thread_name, thread_cpu_seconds  # noqa: E402
from bench_hosts import bench_hosts, in_worker_host, worker_address  # noqa: E402
from interleaved import run_interleaved, summarize  # noqa: E402

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts to run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--batch-per-replica", type=int, default=128)
    p.add_argument("--role", choices=["driver", "worker"], default="driver", help=argparse.SUPPRESS)
    p.add_argument("--result-dir", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    sync = dist.barrier if world > 1 else (lambda: None)
    step = training_step(args, world, rank)
    for i in range(args.warmup):
        step(i)
    sync()
    result = {"rank": rank, **timed_steps(args, step, sync)}
    # torchrun merges the workers' stdout, so each writes its own file.
    with open(os.path.join(args.result_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def training_step(args, world, rank):
    """step(i): one training step of the seed CNN on the i-th batch of this worker's data."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Dropout(0.4), nn.Linear(1024, 10))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1000 + rank)
    n = 4096
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    batch = args.batch_per_replica

    def step(i):
        start = (i * batch) % (n - batch)
        x = images[start:start + batch].float() / 255.0
        y = labels[start:start + batch]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces gradient buckets during the backward pass
        optimizer.step()
        return loss

    return step


def timed_steps(args, step, sync):
    """Throughput and CPU cost of --steps steps after the warm-up; `sync` waits for every worker."""
    cpu_before, threads_before = os.times(), thread_cpu_seconds()
    t0 = time.perf_counter()
    step_s = []
    for i in range(args.steps):
        started = time.perf_counter()
        loss = step(args.warmup + i)
        step_s.append(time.perf_counter() - started)
    float(loss)
    sync()
    wall = time.perf_counter() - t0
    cpu_after = os.times()
    by_name = cpu_by_thread_name(threads_before, thread_cpu_seconds())
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "steps": args.steps, "examples_per_s": args.steps * args.batch_per_replica / wall,
        "step_ms": 1000 * wall / args.steps, "cpu_ms_per_step": 1000 * cpu / args.steps,
        "median_step_ms": 1000 * statistics.median(step_s),
        "cpu_ms_per_step_by_thread": {k: round(1000 * v / args.steps, 2)
                                      for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:8]},
    }


def run_once(args, argv, n, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result_dir = tempfile.mkdtemp(prefix="torch_ddp_peer_")
    me = [os.path.abspath(__file__), *argv, "--role", "worker", "--result-dir", result_dir]
    if n == 1:
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), *me]
    load = os.getloadavg()[0]
    try:
        if bench_hosts():  # one worker per namespace (benchmarks/links.py): started as torchrun would
            proc = _run_on_hosts(me, env, n, timeout)
        else:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        results = []
        for name in sorted(os.listdir(result_dir)):
            with open(os.path.join(result_dir, name)) as f:
                results.append(json.load(f))
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    if proc.returncode != 0 or len(results) != n:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return {
        "workers": n, "load_before": round(load, 2),
        "examples_per_s": sum(r["examples_per_s"] for r in results),
        "examples_per_s_median_step": sum(args.batch_per_replica * 1000 / r["median_step_ms"] for r in results),
        "cpu_ms_per_step": statistics.mean(r["cpu_ms_per_step"] for r in results),
        "per_worker": results,
    }


def _run_on_hosts(me, env, n, timeout):
    """Worker i in namespace i, with the variables torchrun would give it; the first failure's
    status and stderr, or the last worker's."""
    procs = []
    for rank in range(n):
        rank_env = dict(env, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK="0", MASTER_ADDR=worker_address(0),
                        MASTER_PORT="29500")
        procs.append(subprocess.Popen(in_worker_host([sys.executable, *me], rank), env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=timeout) for p in procs]
    failed = next((i for i, p in enumerate(procs) if p.returncode != 0), len(procs) - 1)
    return subprocess.CompletedProcess(procs[failed].args, procs[failed].returncode, *results[failed])


def driver(args, argv):
    counts = [int(c) for c in args.workers.split(",")]
    runs = run_interleaved(counts, args.repeats, lambda n: run_once(args, argv, n))
    print(json.dumps({"peer": "torch DDP gloo",
                      "config": {k: v for k, v in vars(args).items() if k != "role"}, **summarize(runs)}))


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.role == "worker":
        worker(args)
    else:
        driver(args, argv)


if __name__ == "__main__":
    main()
