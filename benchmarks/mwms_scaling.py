#!/usr/bin/env python3
"""Data-parallel scaling of the trainer's seed CNN under MultiWorkerMirroredStrategy on one host.

Starts 1 and 2 worker processes on 127.0.0.1 (TF_CONFIG written here, free ports). Each one builds
its model, optimizer, input pipeline and training loop, gradient exchange included, through
launcher.trainer, so what is measured is the code `mgpu train` runs. It trains on synthetic data
at a fixed batch per replica and prints one JSON object: examples/s per worker count (median of
interleaved repeats), scaling efficiency, and CPU seconds per step split by thread kind (compute,
collective transport, other).

    python benchmarks/mwms_scaling.py --repeats 3                     # the trainer's defaults
    python benchmarks/mwms_scaling.py --repeats 3 --gradient-exchange allreduce --allreduce-dtype float16
    python benchmarks/mwms_scaling.py --repeats 1 -- --mixed-precision mixed_bfloat16

Options after `--` go to the trainer as they are (`mgpu train --help` lists them). Each 2-worker
run first checks the chosen gradient exchange against a float32 all-reduce of the plain gradients
(grad_rel_error). On a machine shared with other programs trust scaling_cpu_bound (CPU time per
step, 1 worker / 2 workers) more than wall-clock scaling.

With --probe allreduce each worker only all-reduces a float32 tensor of --probe-mb megabytes with
the trainer's all-reduce (in --allreduce-dtype), which isolates the wall and CPU cost of one
collective. With --aggregation none the workers train alone, with no collective at all: what is
left is the cost of sharing the machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from cpu_accounting import cpu_by_thread_name, thread_cpu_seconds  # noqa: E402
from bench_hosts import in_worker_host, worker_address  # noqa: E402
from interleaved import run_interleaved, summarize  # noqa: E402

from launcher.errors import UsageError  # noqa: E402
from launcher.host.ports import pick_free_ports  # noqa: E402
from launcher.trainer import options as trainer_options_lib  # noqa: E402

RESULT_PREFIX = "MGPU_BENCH_RESULT "


def parse_args(argv=None):
    """The benchmark's own options; what follows `--` is kept in .trainer_args."""
    own, trainer_args = split_trainer_args(sys.argv[1:] if argv is None else list(argv))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                usage="%(prog)s [options] [-- trainer options]")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts to run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps (tracing, first collectives)")
    p.add_argument("--batch-per-replica", type=int, default=128)
    p.add_argument("--steps-per-call", type=int, default=1, help="training steps per tf.function call")
    p.add_argument("--aggregation", choices=["trainer", "none"], default="trainer",
                   help="trainer: the trainer's gradient exchange; none: no collective, the workers "
                        "train alone (measures CPU contention)")
    _add_trainer_levers(p)
    _add_runtime_levers(p)
    p.add_argument("--probe", choices=["train", "allreduce"], default="train")
    p.add_argument("--probe-mb", type=float, default=13.1)
    p.add_argument("--label", default="")
    p.add_argument("--role", choices=["driver", "worker"], default="driver", help=argparse.SUPPRESS)
    p.add_argument("--num-workers", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(own)
    args.trainer_args = trainer_args
    return args


def split_trainer_args(argv):
    """(the benchmark's arguments, the trainer's: those after the first `--`)."""
    if "--" not in argv:
        return argv, []
    return argv[:argv.index("--")], argv[argv.index("--") + 1:]


def _add_trainer_levers(p):
    """The trainer's options this benchmark varies most, under the trainer's names (and older aliases)."""
    t = trainer_options_lib
    p.add_argument("--optimizer", choices=t.OPTIMIZERS, default="adam")
    p.add_argument("--gradient-exchange", "--dense-grads", choices=t.GRADIENT_EXCHANGES, default="auto",
                   help="as the trainer's --gradient-exchange")
    p.add_argument("--factor-dtype", choices=t.FACTOR_DTYPES, default="int8",
                   help="dtype of the factors on the wire and in the kernel-gradient rebuild")
    p.add_argument("--factor-gather", choices=t.FACTOR_GATHERS, default="together",
                   help="as the trainer's --factor-gather")
    p.add_argument("--allreduce-dtype", choices=t.ALLREDUCE_DTYPES, default="float32")
    p.add_argument("--bytes-per-pack", type=int, default=0)
    p.add_argument("--all-reduce", "--implementation", choices=["auto", "ring"], default="auto",
                   help="collective implementation")
    p.add_argument("--xla", "--jit", action="store_true", help="XLA-compile the forward/backward computation")


def _add_runtime_levers(p):
    """Threads and TensorFlow runtime settings the trainer leaves at their defaults."""
    p.add_argument("--intra-op", type=int, default=1)
    p.add_argument("--inter-op", type=int, default=1)
    p.add_argument("--onednn", choices=["default", "0", "1"], default="default")
    p.add_argument("--recv-buf-chunk", type=int, default=0,
                   help="ConfigProto.experimental.recv_buf_max_chunk: bytes per chunk of a collective "
                        "transfer (0: TF default of 4096, -1: one chunk)")
    p.add_argument("--rpc-channels", type=int, default=0, help="rpc_options.num_channels_per_target")
    p.add_argument("--no-spinning", action="store_true",
                   help="ConfigProto.experimental.disable_thread_spinning")


def trainer_options(args):
    """The trainer's options for this run: the levers above, then whatever followed `--`."""
    argv = ["--model", "cnn", "--dataset", "synthetic",
            "--batch-size-per-replica", str(args.batch_per_replica),
            "--steps-per-loop", str(args.steps_per_call), "--optimizer", args.optimizer,
            "--gradient-exchange", args.gradient_exchange, "--factor-dtype", args.factor_dtype,
            "--factor-gather", args.factor_gather,
            "--allreduce-dtype", args.allreduce_dtype, "--bytes-per-pack", str(args.bytes_per_pack),
            "--all-reduce", args.all_reduce, *(["--xla"] if args.xla else []), *args.trainer_args]
    return trainer_options_lib.parse(argv)


# ----------------------------------------------------------------------------- CPU accounting

def thread_kind(name):
    """Sort TF 2.21 thread names into compute, transport (gRPC and collective executor) and other."""
    n = name.lower()
    if n.startswith(("grpc", "event_engine", "lifeguard", "collective", "default-executo", "timer_manager")):
        return "transport"
    if n.startswith(("tf_compute", "tf_inter_op", "tf_intra_op", "python")):
        return "compute"  # "python" is the main thread, which also runs ops inline
    if n.startswith("tf_data"):
        return "data"
    return "other"


def cpu_delta(before, after):
    by_name = cpu_by_thread_name(before, after)
    by_kind = {}
    for name, seconds in by_name.items():
        kind = thread_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    return by_name, by_kind


# ----------------------------------------------------------------------------- worker

def worker(args):
    """One worker: train (or probe) through the trainer's code, print one result line."""
    set_session_config(args)
    from launcher.trainer import cluster
    from launcher.trainer import strategy as strategy_lib

    opts = trainer_options(args)
    info = cluster.resolve(None, None)  # TF_CONFIG from the driver; without it, a worker alone
    gpus = strategy_lib.configure_runtime(opts)  # threads: the driver's TF_NUM_*_THREADS
    strategy = strategy_lib.build(opts, info, len(gpus))
    measure = probe_allreduce if args.probe == "allreduce" else measure_training
    result = {"index": info.task_index, **measure(args, opts, strategy, len(gpus), info.task_index)}
    if strategy.num_replicas_in_sync > 1:
        strategy_lib.barrier(strategy)  # no worker exits while a peer still talks to it
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def set_session_config(args):
    """ConfigProto settings the trainer leaves alone; MWMS builds its server config from these."""
    if not (args.recv_buf_chunk or args.rpc_channels or args.no_spinning):
        return
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context
    base = config_pb2.ConfigProto()
    base.experimental.recv_buf_max_chunk = args.recv_buf_chunk
    base.experimental.disable_thread_spinning = args.no_spinning
    if args.rpc_channels:
        base.rpc_options.num_channels_per_target = args.rpc_channels
    context.context()._config = base


def measure_training(args, opts, strategy, num_gpus, task_index):
    from launcher.trainer import builders, datasets

    replicas = strategy.num_replicas_in_sync
    batch = trainer_options_lib.global_batch_size(opts, replicas)
    state = builders.train_state(opts, strategy)
    loop = builders.train_loop(opts, strategy, state, batch, num_gpus)
    arrays = datasets.load(opts.dataset, opts.data_dir)
    iterator = iter(builders.train_data(strategy, arrays, seed=opts.seed, start_example=0,
                                        global_batch_size=batch))
    error = gradient_error(opts, strategy, state, loop, batch, iterator) if replicas > 1 else None
    per_call = opts.steps_per_loop
    for _ in range(max(1, args.warmup // per_call)):
        loop.run(iterator, per_call)
    calls = max(1, args.steps // per_call)
    timing = timed_calls(lambda: loop.run(iterator, per_call), calls)  # returns once the steps ran
    steps = calls * per_call
    return {"steps": steps, "grad_rel_error": error, "wall_s": timing["wall_s"],
            "examples_per_s": steps * (batch // replicas) / timing["wall_s"],
            **per_step_costs(timing, steps),
            # The median call is what a step costs when other programs leave the cores alone.
            "median_step_ms": 1000 * timing["median_call_s"] / per_call}


def gradient_error(opts, strategy, state, loop, batch, iterator):
    """Relative L2 distance, on one batch, between the gradients the chosen exchange sums and a
    float32 all-reduce of the plain gradients.

    Both are traced afresh with dropout off, so both forward passes see the same network and the
    training loop's own functions keep their dropout.
    """
    import keras
    import tensorflow as tf
    from launcher.trainer import builders
    from launcher.trainer.allreduce import AllReduceSettings
    from launcher.trainer.steps import replica_gradients

    model, replicas, scaling = state.model, strategy.num_replicas_in_sync, builders.loss_scaling(opts)
    chosen = replica_gradients(model, state.optimizer, batch, replicas, loop.allreduce, loop.factored,
                               scaling, opts.xla)
    plain = replica_gradients(model, state.optimizer, batch, replicas,
                              AllReduceSettings(options=loop.allreduce.options, exchange="allreduce"),
                              [], scaling, opts.xla)
    dropouts = [layer for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    rates = [layer.rate for layer in dropouts]
    for layer in dropouts:
        layer.rate = 0.0

    @tf.function
    def check(iterator):
        def distance(images, labels):
            grads, _, _ = chosen(images, labels)
            reference, _, _ = plain(images, labels)
            diff = tf.add_n([tf.reduce_sum(tf.square(g - r)) for g, r in zip(grads, reference)])
            norm = tf.add_n([tf.reduce_sum(tf.square(r)) for r in reference])
            return tf.sqrt(diff / norm)
        return strategy.run(distance, args=next(iterator))

    try:
        return float(strategy.experimental_local_results(check(iterator))[0])
    finally:
        for layer, rate in zip(dropouts, rates):
            layer.rate = rate


def probe_allreduce(args, opts, strategy, num_gpus, task_index):
    """The trainer's all-reduce of one float32 tensor of --probe-mb megabytes, alone."""
    import tensorflow as tf
    from launcher.trainer import builders
    from launcher.trainer.allreduce import allreduce_gradients

    settings = builders.allreduce_settings(opts, num_gpus)
    elements = int(args.probe_mb * 1e6 / 4)
    with strategy.scope():
        source = tf.Variable(tf.random.normal([elements], seed=task_index))

    @tf.function
    def one():
        return strategy.run(lambda: allreduce_gradients([source.read_value()], settings)[0])

    for _ in range(args.warmup):
        one()
    timing = timed_calls(one, args.steps)
    return {"steps": args.steps, "wall_s": timing["wall_s"], "examples_per_s": 0.0,
            **per_step_costs(timing, args.steps)}


def timed_calls(call, count):
    """Wall and CPU seconds of `count` calls, the CPU split by thread, and the median call."""
    proc_before = os.times()
    threads_before = thread_cpu_seconds()
    call_s = []
    t0 = time.perf_counter()
    for _ in range(count):
        started = time.perf_counter()
        call()  # eager calls return when the function has run
        call_s.append(time.perf_counter() - started)
    wall = time.perf_counter() - t0
    proc_after = os.times()
    by_name, by_kind = cpu_delta(threads_before, thread_cpu_seconds())
    cpu = (proc_after.user - proc_before.user) + (proc_after.system - proc_before.system)
    return {"wall_s": wall, "cpu_s": cpu, "by_name": by_name, "by_kind": by_kind,
            "median_call_s": statistics.median(call_s)}


def per_step_costs(timing, steps):
    return {
        "step_ms": 1000 * timing["wall_s"] / steps, "cpu_ms_per_step": 1000 * timing["cpu_s"] / steps,
        "cpu_ms_per_step_by_kind": {k: round(1000 * v / steps, 2) for k, v in sorted(timing["by_kind"].items())},
        "cpu_ms_per_step_by_thread": {k: round(1000 * v / steps, 2) for k, v in
                                      sorted(timing["by_name"].items(), key=lambda kv: -kv[1])[:12]},
    }


# ----------------------------------------------------------------------------- driver

def worker_argv(argv, n):
    own, trainer_args = split_trainer_args(argv)
    return [sys.executable, os.path.abspath(__file__), *own, "--role", "worker", "--num-workers", str(n),
            "--", *trainer_args]


def run_once(args, argv, n, timeout=900):
    env = dict(os.environ)
    env.update({
        "TF_NUM_INTRAOP_THREADS": str(args.intra_op), "TF_NUM_INTEROP_THREADS": str(args.inter_op),
        "OMP_NUM_THREADS": str(args.intra_op), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "",
    })
    if args.onednn != "default":
        env["TF_ENABLE_ONEDNN_OPTS"] = args.onednn
    env.pop("TF_CONFIG", None)
    # On this machine free ports; across namespaces (benchmarks/links.py) each worker has a host of its own.
    ports = pick_free_ports(n) if worker_address(0) == "127.0.0.1" else [2222] * n
    cluster = {"worker": [f"{worker_address(i)}:{port}" for i, port in enumerate(ports)]}
    envs = []
    for i in range(n):
        envs.append(dict(env))
        if n > 1 and args.aggregation != "none":
            envs[-1]["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
    load = os.getloadavg()[0]
    results = run_workers(worker_argv(argv, n), envs, timeout)
    return {
        "workers": n, "load_before": round(load, 2),
        "examples_per_s": sum(r["examples_per_s"] for r in results),
        "examples_per_s_median_step": sum(args.batch_per_replica * 1000 / r.get("median_step_ms", float("inf"))
                                          for r in results),
        "step_ms": max(r["step_ms"] for r in results),
        "cpu_ms_per_step": statistics.mean(r["cpu_ms_per_step"] for r in results),
        "per_worker": results,
    }


def run_workers(command, envs, timeout):
    """Run one worker per environment; their result lines, or RuntimeError with their stderr."""
    procs = []
    with tempfile.TemporaryDirectory(prefix="mwms_scaling_") as tmp:
        try:
            for i, env in enumerate(envs):
                out = open(os.path.join(tmp, f"{i}.out"), "w+")
                err = open(os.path.join(tmp, f"{i}.err"), "w+")
                procs.append((subprocess.Popen(in_worker_host(command, i), env=env, stdout=out, stderr=err), out, err))
            deadline = time.monotonic() + timeout
            # One failed worker leaves its peers waiting in a collective: stop at the first failure.
            while any(p.poll() is None for p, _, _ in procs):
                if any(p.poll() not in (None, 0) for p, _, _ in procs) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        results, errors = [], []
        for p, out, err in procs:
            out.seek(0)
            err.seek(0)
            lines = [line for line in out.read().splitlines() if line.startswith(RESULT_PREFIX)]
            if p.returncode != 0 or not lines:
                errors.append(f"exit {p.returncode}: {err.read().strip()[-2000:]}")
            else:
                results.append(json.loads(lines[-1][len(RESULT_PREFIX):]))
            out.close()
            err.close()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


def run_with_retry(args, argv, n, attempts=2):
    for attempt in range(attempts):
        try:
            return run_once(args, argv, n)
        except RuntimeError as exc:  # e.g. another program took a port between probe and bind
            if attempt == attempts - 1:
                raise
            print(f"# retrying after failure: {str(exc)[-300:]}", file=sys.stderr, flush=True)


def driver(args, argv):
    counts = [int(c) for c in args.workers.split(",")]
    runs = run_interleaved(counts, args.repeats, lambda n: run_with_retry(args, argv, n))
    print(json.dumps({"label": args.label,
                      "config": {k: v for k, v in vars(args).items() if k not in ("role", "num_workers")},
                      **summarize(runs)}))


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.role == "worker":
        worker(args)
        return
    try:
        trainer_options(args)  # bad trainer options: say so before starting anything
    except UsageError as exc:
        sys.exit(f"{os.path.basename(__file__)}: error: {exc}")
    driver(args, argv)


if __name__ == "__main__":
    main()
