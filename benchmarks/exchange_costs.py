#!/usr/bin/env python3
"""The constants of the gradient-exchange cost model, in CPU seconds, measured on this machine.

The trainer chooses per Dense layer between all-reducing its kernel gradient and exchanging
factors (launcher/trainer/exchange_cost.py). This measures what that choice weighs:
- one-thread matmul cost per multiply-add, float32 and bfloat16, in the shapes the two paths run
  (the local kernel gradient X^T dY of b rows; the rebuild of R x b rows), and the cost per element
  of casting the rebuilt bfloat16 kernel gradient to float32;
- CPU cost per byte that one worker receives, for TF's collective all-reduce (float32, the
  trainer's all-reduce) and all-gather (16-bit, as the factors travel), 2 workers on 127.0.0.1,
  fitted over several sizes (the intercept, a per-call cost, is the same once per step either way).

CPU time (user + system of the whole process, every thread) is what is counted, so the figures
hold on a machine busy with other programs. Prints one JSON object; with --table, the cost model
with the measured constants for the seed CNN's 3136x1024 layer at R = 2..16.

    nice python benchmarks/exchange_costs.py --repeats 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from cpu_accounting import cpu_by_thread_name, thread_cpu_seconds  # noqa: E402
from mwms_scaling import RESULT_PREFIX, run_workers  # noqa: E402

from launcher.host.ports import pick_free_ports  # noqa: E402
from launcher.trainer import exchange_cost  # noqa: E402

KERNEL = (3136, 1024)  # the seed CNN's big Dense layer
BATCH = 128
ALLREDUCE_MB = (3.3, 6.6, 13.1)  # float32 tensors all-reduced (13.1 MB: the whole CNN gradient)
ALLGATHER_MB = (1.1, 2.2, 4.4)  # 16-bit tensors each worker contributes (1.1 MB: 128 x 4160 bfloat16)


def cpu_seconds(call, count):
    """CPU seconds per call of `call`, all threads of the process, over `count` calls.

    From the scheduler's per-thread nanoseconds: os.times() counts in 10 ms ticks.
    """
    before = thread_cpu_seconds()
    for _ in range(count):
        call()
    spent = cpu_by_thread_name(before, thread_cpu_seconds())
    return sum(spent.values()) / count


def median_cpu(call, count, repeats):
    call()  # tracing, first run
    return statistics.median(cpu_seconds(call, count) for _ in range(repeats))


def measure_matmuls(args):
    """Seconds per multiply-add (and per cast element), one thread."""
    import tensorflow as tf
    n_in, n_out = KERNEL
    result = {}
    for dtype in ("float32", "bfloat16"):
        for rows in (BATCH, 2 * BATCH, 4 * BATCH, 8 * BATCH):
            x = tf.cast(tf.random.normal([rows, n_in]), dtype)
            dy = tf.cast(tf.random.normal([rows, n_out]), dtype)
            matmul = tf.function(lambda: tf.matmul(x, dy, transpose_a=True))
            seconds = median_cpu(lambda: matmul().numpy(), args.count, args.repeats)
            result[f"{dtype}_rows{rows}_s_per_mac"] = seconds / (rows * n_in * n_out)
    kernel = tf.cast(tf.random.normal(KERNEL), tf.bfloat16)
    # Eager: inside a function the optimizer could move the cast past anything that shrinks it.
    cast_s = median_cpu(lambda: tf.cast(kernel, tf.float32), args.count, args.repeats)
    result["cast_bfloat16_to_float32_s_per_element"] = cast_s / (n_in * n_out)
    return result


def measure_collectives(args):
    """CPU seconds per call of the all-reduce and the all-gather at each size, on this worker."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    kinds = {"allreduce": (ALLREDUCE_MB, tf.float32), "allgather": (ALLGATHER_MB, tf.float16),
             # 16-bit all-reduces of the same numbers of values as the float32 ones
             "allreduce_bfloat16": ([mb / 2 for mb in ALLREDUCE_MB], tf.bfloat16),
             "allreduce_float16": ([mb / 2 for mb in ALLREDUCE_MB], tf.float16)}
    result = {kind: {} for kind in kinds}
    for kind, (sizes, dtype) in kinds.items():
        width = dtype.size
        for mb in sizes:
            # Variables are broadcast at creation, which has no bfloat16 kernel: the bfloat16
            # all-reduce casts from float32 each call, as the trainer does with its gradients.
            with strategy.scope():
                source = tf.Variable(tf.cast(tf.random.normal([int(mb * 1e6 / width)]),
                                             tf.float32 if dtype == tf.bfloat16 else dtype))

            def replica(source=source, kind=kind, dtype=dtype):
                ctx = tf.distribute.get_replica_context()
                value = tf.cast(source.read_value(), dtype)
                if kind.startswith("allreduce"):
                    out = ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)
                else:
                    out = ctx.all_gather(value, axis=0)
                return out[:1]

            step = tf.function(lambda replica=replica: strategy.run(replica))
            result[kind][str(mb)] = median_cpu(lambda: step().numpy(), args.count, args.repeats)
    return result


def worker(args):
    measure = measure_matmuls if args.role == "matmul" else measure_collectives
    print(RESULT_PREFIX + json.dumps(measure(args)), flush=True)


def slope(points):
    """Least-squares slope of [(x, y)]."""
    mx = statistics.mean(x for x, _ in points)
    my = statistics.mean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def fit(collectives):
    """CPU seconds per byte each worker receives, 2 workers: an all-reduce of N bytes brings
    2(R-1)/R x N = N bytes to each; an all-gather of n bytes per worker brings (R-1) x n = n."""
    per_worker = {kind: {mb: statistics.mean(w[kind][mb] for w in collectives) for mb in collectives[0][kind]}
                  for kind in collectives[0]}
    return {f"{kind}_s_per_byte": slope([(float(mb) * 1e6, s) for mb, s in cpu.items()])
            for kind, cpu in per_worker.items()}, per_worker


def base_env():
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    return env


def driver(args):
    started = time.time()
    own = [sys.executable, os.path.abspath(__file__), "--count", str(args.count), "--repeats", str(args.repeats)]
    matmul = run_workers([*own, "--role", "matmul"], [base_env()], timeout=900)[0]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in pick_free_ports(2)]}
    envs = [dict(base_env(), TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
            for i in range(2)]
    collectives = run_workers([*own, "--role", "collectives"], envs, timeout=900)
    per_byte, per_worker = fit(collectives)
    constants = {**per_byte,
                 "float32_s_per_mac": matmul[f"float32_rows{BATCH}_s_per_mac"],
                 "bfloat16_s_per_mac": statistics.median(matmul[f"bfloat16_rows{r * BATCH}_s_per_mac"]
                                                         for r in (2, 4, 8)),
                 "cast_s_per_element": matmul["cast_bfloat16_to_float32_s_per_element"]}
    result = {"machine": machine(), "constants": constants, "matmul": matmul,
              "collective_cpu_s_per_call": per_worker, "wall_s": round(time.time() - started, 1)}
    if args.table:
        measured = exchange_cost.CostConstants(
            allreduce_s_per_byte=constants["allreduce_s_per_byte"],
            allgather_s_per_byte=constants["allgather_s_per_byte"],
            float32_s_per_mac=constants["float32_s_per_mac"], bfloat16_s_per_mac=constants["bfloat16_s_per_mac"],
            cast_s_per_value=constants["cast_s_per_element"])
        result["table_measured"] = exchange_cost.markdown_table(*KERNEL, BATCH, range(2, 17), measured)
        result["table_in_code"] = exchange_cost.markdown_table(*KERNEL, BATCH, range(2, 17))
    print(json.dumps(result, indent=1))


def machine():
    model = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                           capture_output=True, text=True).stdout.strip()
    return f"{model}, {os.cpu_count()} CPUs"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10, help="calls per timing")
    p.add_argument("--repeats", type=int, default=3, help="timings per figure (the median is kept)")
    p.add_argument("--table", action="store_true", help="print the cost model's table too")
    p.add_argument("--role", choices=["driver", "matmul", "collectives"], default="driver", help=argparse.SUPPRESS)
    args = p.parse_args()
    (driver if args.role == "driver" else worker)(args)


if __name__ == "__main__":
    main()
