#!/usr/bin/env python3
"""Data-parallel scaling of the seed CNN under MultiWorkerMirroredStrategy on one host.

Starts 1 and 2 worker processes on 127.0.0.1 (TF_CONFIG written here, free ports), trains the
seed CNN with a custom loop on synthetic 28x28x1 data at a fixed batch per replica, and prints
one JSON object: examples/s per worker count (median of interleaved repeats), scaling
efficiency, and CPU seconds per step split by thread kind (compute, collective transport, other).

    python benchmarks/mwms_scaling.py --repeats 3 --aggregation keras       # MWMS defaults
    python benchmarks/mwms_scaling.py --repeats 3 --dense-grads factors --single-collective \
        --factor-dtype bfloat16 --factor-matmul-dtype bfloat16 --steps-per-call 10

Each 2-worker run first checks the chosen gradient exchange against a float32 all-reduce of
the plain gradients (grad_rel_error). On a machine shared with other programs trust
scaling_cpu_bound (CPU time per step, 1 worker / 2 workers) more than wall-clock scaling.

With --probe allreduce each worker only all-reduces a float32 tensor of --probe-mb megabytes,
which isolates the wall and CPU cost of one collective.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_accounting import cpu_by_thread_name, thread_cpu_seconds  # noqa: E402
from interleaved import run_interleaved, summarize  # noqa: E402

from launcher.host.ports import pick_free_ports

RESULT_PREFIX = "MGPU_BENCH_RESULT "


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts to run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps (tracing, first collectives)")
    p.add_argument("--batch-per-replica", type=int, default=128)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--aggregation", choices=["keras", "custom", "none"], default="custom",
                   help="keras: the optimizer all-reduces (MWMS defaults); custom: all_reduce_gradients "
                        "below; none: no all-reduce (workers train independently, measures CPU contention)")
    p.add_argument("--allreduce-dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--grad-scale", type=float, default=1.0,
                   help="multiply gradients by this before the cast, divide after (keeps fp16 out of subnormals)")
    p.add_argument("--bytes-per-pack", type=int, default=0)
    p.add_argument("--implementation", choices=["auto", "ring"], default="auto")
    p.add_argument("--fuse", action="store_true", help="concat all gradients into one flat tensor ourselves")
    p.add_argument("--overlap", choices=["none", "split"], default="none",
                   help="split: back-propagate the dense head first and start its all-reduce before the "
                        "convolution gradients are computed")
    p.add_argument("--dense-grads", choices=["allreduce", "factors"], default="allreduce",
                   help="factors: for Dense layers whose kernel is larger than batch x (inputs + outputs), "
                        "all-gather the layer inputs and output gradients and form the summed kernel "
                        "gradient locally (exact; trades comm bytes for one extra matmul)")
    p.add_argument("--single-collective", action="store_true",
                   help="with --dense-grads factors: one all-gather carries the factors and every other "
                        "gradient (summed locally), instead of one collective per tensor kind")
    p.add_argument("--factor-dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--factor-matmul-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the matmul that rebuilds kernel gradients from factors (bfloat16 uses AMX)")
    p.add_argument("--jit", action="store_true", help="XLA-compile the forward/backward computation")
    p.add_argument("--intra-op", type=int, default=1)
    p.add_argument("--inter-op", type=int, default=1)
    p.add_argument("--onednn", choices=["default", "0", "1"], default="default")
    p.add_argument("--prefetch", type=int, default=0, help="tf.data prefetch depth (0: none, -1: AUTOTUNE)")
    p.add_argument("--cache", action="store_true")
    p.add_argument("--steps-per-call", type=int, default=1, help="training steps per tf.function call")
    p.add_argument("--recv-buf-chunk", type=int, default=0,
                   help="ConfigProto.experimental.recv_buf_max_chunk: bytes per chunk of a collective "
                        "transfer (0: TF default of 4096, -1: one chunk)")
    p.add_argument("--rpc-channels", type=int, default=0, help="rpc_options.num_channels_per_target")
    p.add_argument("--no-spinning", action="store_true",
                   help="ConfigProto.experimental.disable_thread_spinning")
    p.add_argument("--probe", choices=["train", "allreduce"], default="train")
    p.add_argument("--probe-mb", type=float, default=13.1)
    p.add_argument("--label", default="")
    p.add_argument("--role", choices=["driver", "worker"], default="driver", help=argparse.SUPPRESS)
    p.add_argument("--num-workers", type=int, default=1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


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

def make_dataset(tf, batch, seed, cache, prefetch):
    rng = tf.random.Generator.from_seed(seed)
    n = 4096
    images = tf.cast(rng.uniform((n, 28, 28, 1), 0, 256, dtype=tf.int32), tf.uint8)
    labels = rng.uniform((n,), 0, 10, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
    if cache:
        ds = ds.cache()
    ds = ds.repeat().batch(batch, drop_remainder=True)
    if prefetch:
        ds = ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)
    return ds


def all_reduce_gradients(tf, grads, dtype, scale, fuse, options):
    """Sum gradients across replicas in `dtype` (the loss is already divided by the global batch)."""
    ctx = tf.distribute.get_replica_context()
    if fuse:
        shapes = [g.shape for g in grads]
        parts = [tf.concat([tf.reshape(g, [-1]) for g in grads], 0)]
    else:
        parts = list(grads)
    if dtype != tf.float32:
        parts = [tf.cast(g * scale if scale != 1.0 else g, dtype) for g in parts]
    reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, parts, options=options)
    if dtype != tf.float32:
        reduced = [tf.cast(r, tf.float32) for r in reduced]
        if scale != 1.0:
            reduced = [r / scale for r in reduced]
    if fuse:
        sizes = [s.num_elements() for s in shapes]
        reduced = [tf.reshape(r, s) for r, s in zip(tf.split(reduced[0], sizes), shapes)]
    return reduced


def worker(args):
    import tensorflow as tf
    import keras

    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    n = args.num_workers
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=args.bytes_per_pack,
        implementation=(tf.distribute.experimental.CommunicationImplementation.RING
                        if args.implementation == "ring" else
                        tf.distribute.experimental.CommunicationImplementation.AUTO))
    distributed = n > 1 and args.aggregation != "none"
    if args.recv_buf_chunk or args.rpc_channels or args.no_spinning:
        # MWMS builds its server config from the eager context's base ConfigProto.
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.eager import context
        base = config_pb2.ConfigProto()
        base.experimental.recv_buf_max_chunk = args.recv_buf_chunk
        base.experimental.disable_thread_spinning = args.no_spinning
        if args.rpc_channels:
            base.rpc_options.num_channels_per_target = args.rpc_channels
        context.context()._config = base
    if distributed:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = tf.distribute.get_strategy()
    replicas = n if distributed else 1
    batch = args.batch_per_replica
    global_batch = batch * replicas
    index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    dtype = getattr(tf, args.allreduce_dtype)

    if args.probe == "allreduce":
        return probe_allreduce(tf, strategy, args, options)

    with strategy.scope():
        from launcher.trainer import models
        model = models.build("cnn")  # the seed CNN the trainer runs
        optimizer = (keras.optimizers.Adam(1e-3) if args.optimizer == "adam"
                     else keras.optimizers.SGD(0.01, momentum=0.9))
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    variables = model.trainable_variables
    layer_list = model.layers
    cut = [i for i, layer in enumerate(layer_list) if isinstance(layer, keras.layers.Flatten)][0] + 1
    head_vars = [v for layer in layer_list[cut:] for v in layer.trainable_variables]
    body_vars = [v for layer in layer_list[:cut] for v in layer.trainable_variables]

    def loss_of(logits, y):
        return tf.reduce_sum(loss_fn(y, logits)) / global_batch

    def grads_whole(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(model(x, training=True), y)
        return loss, tape.gradient(loss, variables)

    compute = tf.function(grads_whole, jit_compile=True) if args.jit else grads_whole

    def reduce(grads):
        if not distributed:
            return grads
        return all_reduce_gradients(tf, grads, dtype, args.grad_scale, args.fuse, options)

    if args.aggregation == "custom":
        # Gradients arrive already summed across replicas: the optimizer must not all-reduce again.
        optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)

    def apply(grads, var_list):
        optimizer.apply(grads, var_list)

    # Dense layers where all-gathering (inputs, output gradients) moves fewer bytes than the kernel.
    factor_layers = [layer for layer in layer_list if isinstance(layer, keras.layers.Dense)
                     # bytes each worker receives: all-gather (n-1)*b*(in+out), ring all-reduce 2(n-1)/n*in*out
                     and replicas * batch * (layer.kernel.shape[0] + layer.kernel.shape[1])
                     < 2 * layer.kernel.shape[0] * layer.kernel.shape[1]] if distributed else []
    factor_kernels = [layer.kernel for layer in factor_layers]
    other_vars = [v for v in variables if not any(v is k for k in factor_kernels)]
    factor_dtype = getattr(tf, args.factor_dtype)

    def gather(t):
        ctx = tf.distribute.get_replica_context()
        if factor_dtype == tf.float32:
            return ctx.all_gather(t, axis=0, options=options)
        low = tf.cast(t, factor_dtype)
        if factor_dtype == tf.bfloat16:  # all-gather only copies, and it has no bfloat16 kernel
            gathered = tf.bitcast(ctx.all_gather(tf.bitcast(low, tf.float16), axis=0, options=options),
                                  tf.bfloat16)
        else:
            gathered = ctx.all_gather(low, axis=0, options=options)
        return tf.cast(gathered, tf.float32)

    def gather_everything(inputs_list, d_outs, other_grads):
        """One all-gather of [layer inputs, output gradients, other gradients] from every replica."""
        s = args.grad_scale
        pieces = ([tf.reshape(t, [-1]) for t in inputs_list] + [tf.reshape(d * s, [-1]) for d in d_outs]
                  + [tf.reshape(g * s, [-1]) for g in other_grads])
        sizes = [p.shape.num_elements() for p in pieces]
        flat = tf.concat(pieces, 0)
        rows = tf.reshape(gather(flat), [replicas, sum(sizes)])  # one row per replica
        parts = tf.split(rows, sizes, axis=1)
        k = len(inputs_list)
        kernel_grads = []
        for i in range(k):
            xs = tf.reshape(parts[i], [replicas * inputs_list[i].shape[0], -1])
            ds = tf.reshape(parts[k + i], [replicas * d_outs[i].shape[0], -1]) / s
            if args.factor_matmul_dtype == "bfloat16":
                low = tf.matmul(tf.cast(xs, tf.bfloat16), tf.cast(ds, tf.bfloat16), transpose_a=True)
                kernel_grads.append(tf.cast(low, tf.float32))
            else:
                kernel_grads.append(tf.matmul(xs, ds, transpose_a=True))
        summed = [tf.reshape(tf.reduce_sum(p, 0) / s, g.shape) for p, g in zip(parts[2 * k:], other_grads)]
        return kernel_grads, summed

    def grads_by_factors(x, y):
        with tf.GradientTape() as tape:
            h = x
            recorded = []
            for layer in layer_list:
                inputs = h
                h = layer(h, training=True)
                if any(layer is f for f in factor_layers):
                    recorded.append((inputs, h))
            loss = loss_of(h, y)
        grads = tape.gradient(loss, other_vars + [out for _, out in recorded])
        other_grads, d_outs = grads[:len(other_vars)], grads[len(other_vars):]
        if args.single_collective:
            kernel_grads, other_grads = gather_everything(
                [inputs for inputs, _ in recorded], d_outs, other_grads)
            return loss, other_grads + kernel_grads, other_vars + factor_kernels
        kernel_grads = []
        s = args.grad_scale  # keeps low-precision output gradients out of the subnormal range
        for (inputs, _), d_out in zip(recorded, d_outs):
            # The loss is divided by the global batch, so summing over all rows gives the mean gradient.
            kernel_grads.append(tf.matmul(gather(inputs), gather(d_out * s) / s, transpose_a=True))
        return loss, reduce(other_grads) + kernel_grads, other_vars + factor_kernels

    def grads_head_first(x, y):
        with tf.GradientTape(persistent=True) as tape:
            h = x
            for layer in layer_list[:cut]:
                h = layer(h, training=True)
            features = h
            for layer in layer_list[cut:]:
                h = layer(h, training=True)
            loss = loss_of(h, y)
        *head_grads, d_features = tape.gradient(loss, head_vars + [features])
        head_grads = reduce(head_grads)  # starts while the convolution gradients are computed
        body_grads = reduce(tape.gradient(features, body_vars, output_gradients=d_features))
        del tape
        return loss, head_grads + body_grads, head_vars + body_vars

    def reduced_grads(x, y):
        """(loss, gradients summed over replicas, their variables) by the chosen method."""
        if factor_layers and args.dense_grads == "factors":
            return grads_by_factors(x, y)
        if args.overlap == "split":
            return grads_head_first(x, y)
        loss, grads = compute(x, y)
        return loss, reduce(grads), variables

    def replica_step(x, y):
        if args.aggregation == "keras" and distributed:
            loss, grads = compute(x, y)
            optimizer.apply(grads, variables)  # Keras all-reduces with the strategy's defaults
            return loss
        loss, grads, var_list = reduced_grads(x, y)
        apply(grads, var_list)
        return loss

    @tf.function
    def train_call(iterator):
        loss = tf.constant(0.0)
        for _ in tf.range(args.steps_per_call) if args.steps_per_call > 1 else range(1):
            x, y = next(iterator)
            loss = strategy.run(replica_step, args=(x, y))
        return loss

    ds = strategy.distribute_datasets_from_function(
        lambda ctx: make_dataset(tf, batch, 1000 + index, args.cache, args.prefetch))
    iterator = iter(ds)
    error = verify(tf, strategy, keras, model, iterator, reduced_grads, grads_whole) \
        if distributed and args.aggregation == "custom" else None
    calls = lambda steps: max(1, steps // args.steps_per_call)
    for _ in range(calls(args.warmup)):
        train_call(iterator)
    float(strategy.experimental_local_results(train_call(iterator))[0])

    proc_before = os.times()
    threads_before = thread_cpu_seconds()
    t0 = time.perf_counter()
    timed = calls(args.steps)
    call_s = []
    for _ in range(timed):
        started = time.perf_counter()
        loss = train_call(iterator)  # eager calls return when the function has run
        call_s.append(time.perf_counter() - started)
    float(strategy.experimental_local_results(loss)[0])
    wall = time.perf_counter() - t0
    proc_after = os.times()
    by_name, by_kind = cpu_delta(threads_before, thread_cpu_seconds())
    steps = timed * args.steps_per_call
    cpu = (proc_after.user - proc_before.user) + (proc_after.system - proc_before.system)
    result = {
        "index": index, "steps": steps, "grad_rel_error": error, "wall_s": wall, "examples_per_s": steps * batch / wall,
        "step_ms": 1000 * wall / steps, "cpu_ms_per_step": 1000 * cpu / steps,
        # The median call is what a step costs when other programs leave the cores alone.
        "median_step_ms": 1000 * statistics.median(call_s) / args.steps_per_call,
        "cpu_ms_per_step_by_kind": {k: round(1000 * v / steps, 2) for k, v in sorted(by_kind.items())},
        "cpu_ms_per_step_by_thread": {k: round(1000 * v / steps, 2)
                                      for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]},
    }
    if distributed:
        finish_together(tf, strategy)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def verify(tf, strategy, keras, model, iterator, reduced_grads, grads_whole):
    """Relative L2 distance between the chosen reduction and a float32 all-reduce of plain gradients.

    Dropout is off while checking so that both forward passes see the same network.
    """
    dropouts = [layer for layer in model.layers if isinstance(layer, keras.layers.Dropout)]
    rates = [layer.rate for layer in dropouts]
    for layer in dropouts:
        layer.rate = 0.0

    @tf.function
    def check(iterator):
        def fn(x, y):
            _, grads, var_list = reduced_grads(x, y)
            _, plain = grads_whole(x, y)
            ref = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, plain)
            by_var = {id(v): r for v, r in zip(model.trainable_variables, ref)}
            diff = tf.add_n([tf.reduce_sum(tf.square(g - by_var[id(v)])) for g, v in zip(grads, var_list)])
            norm = tf.add_n([tf.reduce_sum(tf.square(r)) for r in ref])
            return tf.sqrt(diff / norm)
        return strategy.run(fn, args=next(iterator))

    error = float(strategy.experimental_local_results(check(iterator))[0])
    for layer, rate in zip(dropouts, rates):
        layer.rate = rate
    return error


def finish_together(tf, strategy):
    """A last collective so no worker exits while a peer still talks to it."""
    @tf.function
    def barrier():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.constant(1.0)))
    barrier()


def probe_allreduce(tf, strategy, args, options):
    elements = int(args.probe_mb * 1e6 / 4)
    index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    dtype = getattr(tf, args.allreduce_dtype)
    with strategy.scope():
        source = tf.Variable(tf.random.normal([elements], seed=index))

    @tf.function
    def one():
        def fn():
            t = tf.cast(source, dtype) if dtype != tf.float32 else source.read_value()
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, t, options=options)
        return strategy.run(fn)

    for _ in range(args.warmup):
        one()
    proc_before = os.times()
    threads_before = thread_cpu_seconds()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        out = one()
    float(tf.reduce_sum(strategy.experimental_local_results(out)[0][:1]))
    wall = time.perf_counter() - t0
    proc_after = os.times()
    by_name, by_kind = cpu_delta(threads_before, thread_cpu_seconds())
    cpu = (proc_after.user - proc_before.user) + (proc_after.system - proc_before.system)
    finish_together(tf, strategy)
    print(RESULT_PREFIX + json.dumps({
        "index": index, "steps": args.steps, "step_ms": 1000 * wall / args.steps,
        "cpu_ms_per_step": 1000 * cpu / args.steps, "examples_per_s": 0.0,
        "cpu_ms_per_step_by_kind": {k: round(1000 * v / args.steps, 2) for k, v in sorted(by_kind.items())},
        "cpu_ms_per_step_by_thread": {k: round(1000 * v / args.steps, 2)
                                      for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]},
    }), flush=True)


# ----------------------------------------------------------------------------- driver

def worker_argv(argv, n):
    return [sys.executable, os.path.abspath(__file__), *argv, "--role", "worker", "--num-workers", str(n)]


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
    cluster = {"worker": [f"127.0.0.1:{p}" for p in pick_free_ports(n)]}
    load = os.getloadavg()[0]
    procs = []
    with tempfile.TemporaryDirectory(prefix="mwms_scaling_") as tmp:
        try:
            for i in range(n):
                wenv = dict(env)
                if n > 1 and args.aggregation != "none":
                    wenv["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
                out = open(os.path.join(tmp, f"{i}.out"), "w+")
                err = open(os.path.join(tmp, f"{i}.err"), "w+")
                procs.append((subprocess.Popen(worker_argv(argv, n), env=wenv, stdout=out, stderr=err), out, err))
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
            lines = [l for l in out.read().splitlines() if l.startswith(RESULT_PREFIX)]
            if p.returncode != 0 or not lines:
                errors.append(f"exit {p.returncode}: {err.read().strip()[-2000:]}")
            else:
                results.append(json.loads(lines[-1][len(RESULT_PREFIX):]))
            out.close()
            err.close()
    if errors:
        raise RuntimeError("; ".join(errors))
    return {
        "workers": n, "load_before": round(load, 2),
        "examples_per_s": sum(r["examples_per_s"] for r in results),
        "examples_per_s_median_step": sum(args.batch_per_replica * 1000 / r.get("median_step_ms", float("inf"))
                                          for r in results),
        "step_ms": max(r["step_ms"] for r in results),
        "cpu_ms_per_step": statistics.mean(r["cpu_ms_per_step"] for r in results),
        "per_worker": results,
    }


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
    else:
        driver(args, argv)


if __name__ == "__main__":
    main()
