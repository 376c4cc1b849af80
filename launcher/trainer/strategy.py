"""TensorFlow runtime set-up (threads, GPUs, precision) and the distribution strategy."""

from __future__ import annotations

import os

import keras
import tensorflow as tf

from launcher.errors import UsageError
from launcher.trainer import cluster as cluster_lib
from launcher.trainer.options import TrainOptions

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def thread_counts(threads: int | None, environ=os.environ) -> tuple[int, int]:
    """(intra, inter) op threads: --threads, else the launcher's env vars, else 0 (TF decides)."""
    if threads is not None:
        return threads, threads

    def env_int(name):
        try:
            text = environ.get(name, "0")
            if not text.isascii():  # int() also reads digits of other scripts
                raise ValueError(text)
            return max(0, int(text))
        except ValueError:
            raise UsageError(f"{name} must be an integer, not {environ[name]!r}") from None
    return env_int("TF_NUM_INTRAOP_THREADS"), env_int("TF_NUM_INTEROP_THREADS")


def configure_runtime(opts: TrainOptions) -> list:
    """Must run before TensorFlow initialises its devices. Returns the local GPUs."""
    intra, inter = thread_counts(opts.threads)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if opts.mixed_precision:
        keras.mixed_precision.set_global_policy(opts.mixed_precision)
    return gpus


def communication_options(opts: TrainOptions, num_gpus: int):
    if opts.all_reduce == "nccl" and num_gpus == 0:
        raise UsageError("--all-reduce nccl needs GPUs; this host has none")
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=opts.bytes_per_pack,
        timeout_seconds=opts.collective_timeout,
        implementation=_IMPLEMENTATIONS[opts.all_reduce],
    )


def build(opts: TrainOptions, info: cluster_lib.ClusterInfo, num_gpus: int) -> tf.distribute.Strategy:
    kind = cluster_lib.choose_strategy(opts.distribution_strategy, info.num_workers, num_gpus)
    comm = communication_options(opts, num_gpus)
    if kind == "multi_worker_mirrored":
        # Uses every local GPU (or the CPU) of every worker.
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
    if kind == "mirrored":
        devices = [f"/gpu:{i}" for i in range(num_gpus)] or ["/cpu:0"]
        return tf.distribute.MirroredStrategy(devices)
    if kind == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if num_gpus else "/cpu:0")
    return tf.distribute.get_strategy()


FINAL_BARRIER_TIMEOUT_MS = 3600 * 1000  # the chief may export a large model first


def final_barrier(strategy: tf.distribute.Strategy) -> None:
    """Return once every worker got here, through the coordination service: prompt where a
    collective all-reduce takes seconds to set up. The last barrier of the process only
    (its id is fixed); without a coordination service, the all-reduce barrier."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        from tensorflow.python.eager import context  # wait_at_barrier has no public API

        try:
            context.context().wait_at_barrier("mgpu-final", FINAL_BARRIER_TIMEOUT_MS)
            return
        except tf.errors.FailedPreconditionError:  # "Coordination service is not enabled": one worker
            pass
    barrier(strategy)


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Return once every replica of every worker got here (a tiny all-reduce)."""
    @tf.function
    def all_reduce_one():
        def replica():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]))
        return strategy.run(replica)
    all_reduce_one()
