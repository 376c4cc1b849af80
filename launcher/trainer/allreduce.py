"""The gradient exchange: the one place where gradients cross replicas and workers.

Called in replica context with this replica's gradients of loss / global_batch_size;
returns their sum over all replicas, which is the gradient of the global mean loss.
Everything that shapes the communication (method, wire dtype, packing, implementation,
timeout) is decided here, so tuning it touches nothing else.

Two methods:
- allreduce: every gradient is all-reduced.
- factors: for a Dense layer without activation, the kernel gradient summed over replicas
  is X^T @ dY over all replicas' rows, where X are the layer's inputs and dY the
  gradients at its output. When the batch is small next to the kernel, every replica
  all-gathers X and dY (b x (in + out) values) instead of reducing the kernel gradient
  (in x out values) and rebuilds the sum locally with one matmul (replicas x b rows).
  Every other gradient travels flattened in the same single all-gather and is summed
  locally. Which layers do so: exchange_cost.py weighs bytes and the rebuild's compute.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from launcher.trainer import exchange_cost

# float16 has a narrow range: gradients are scaled up before the cast so that small
# ones do not flush to zero, and scaled back after the sum.
FLOAT16_SCALE = 256.0


@dataclasses.dataclass(frozen=True)
class AllReduceSettings:
    wire_dtype: str = "float32"  # allreduce: float32 | float16 | bfloat16
    options: tf.distribute.experimental.CommunicationOptions | None = None
    exchange: str = "auto"  # auto | allreduce | factors
    factor_dtype: str = "bfloat16"  # factors: wire and rebuild dtype, bfloat16 | float32
    gpus: int = 0  # GPUs of this worker: the cost model's constants are CPU costs


def allreduce_gradients(grads: list[tf.Tensor], settings: AllReduceSettings) -> list[tf.Tensor]:
    ctx = tf.distribute.get_replica_context()
    wire = tf.as_dtype(settings.wire_dtype)
    scale = FLOAT16_SCALE if wire == tf.float16 else 1.0
    sent = [g if g.dtype == wire else tf.cast(g * scale if scale != 1.0 else g, wire) for g in grads]
    summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, sent, options=settings.options)
    return [s if s.dtype == g.dtype else _unscale(tf.cast(s, g.dtype), scale)
            for s, g in zip(summed, grads)]


def _unscale(t: tf.Tensor, scale: float) -> tf.Tensor:
    return t / scale if scale != 1.0 else t


def _linear_dense(layer) -> bool:
    return (isinstance(layer, keras.layers.Dense)
            and layer.activation in (None, keras.activations.linear))


def factored_layers(model: keras.Model, batch_per_replica: int, replicas: int,
                    settings: AllReduceSettings = AllReduceSettings()) -> list:
    """Dense layers whose factors cost a worker less CPU per step than all-reducing their
    kernel gradient: wire bytes and the rebuild's multiply-adds, launcher.trainer.exchange_cost."""
    return [layer for layer in model.layers if _linear_dense(layer) and exchange_cost.factors_cheaper(
        *layer.kernel.shape, batch_per_replica, replicas, allreduce_dtype=settings.wire_dtype,
        factor_dtype=settings.factor_dtype, compute_dtype=layer.compute_dtype)]


def choose_factored_layers(settings: AllReduceSettings, model: keras.Model,
                           batch_per_replica: int, replicas: int) -> list:
    """The layers whose kernel gradients are rebuilt from factors (empty: plain all-reduce).

    `auto` on a worker with GPUs all-reduces every gradient: the cost model weighs bytes against
    CPU multiply-adds, measured on CPUs, and says nothing of NCCL's all-reduce on GPUs.
    """
    if settings.exchange == "allreduce" or (settings.exchange == "auto" and settings.gpus > 0):
        return []
    if settings.exchange == "factors":
        return [layer for layer in model.layers if _linear_dense(layer)]
    return factored_layers(model, batch_per_replica, replicas, settings)


def exchange_gradients(grads: list[tf.Tensor], factors: list[tuple[tf.Tensor, tf.Tensor]],
                       settings: AllReduceSettings) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """One all-gather of this replica's gradients and (inputs, output gradients) pairs.

    Returns the gradients summed over replicas and, per pair, the kernel gradient summed
    over replicas, all float32.
    """
    ctx = tf.distribute.get_replica_context()
    replicas = ctx.num_replicas_in_sync
    wire = tf.as_dtype(settings.factor_dtype)
    pieces = ([tf.reshape(x, [-1]) for x, _ in factors] + [tf.reshape(dy, [-1]) for _, dy in factors]
              + [tf.reshape(g, [-1]) for g in grads])
    sizes = [p.shape.num_elements() for p in pieces]
    flat = tf.concat([tf.cast(p, wire) for p in pieces], 0)
    if wire == tf.bfloat16:
        # An all-gather only copies bytes, and it has no bfloat16 kernel.
        gathered = tf.bitcast(ctx.all_gather(tf.bitcast(flat, tf.float16), axis=0,
                                             options=settings.options), tf.bfloat16)
    else:
        gathered = ctx.all_gather(flat, axis=0, options=settings.options)
    rows = tf.split(tf.reshape(gathered, [replicas, sum(sizes)]), sizes, axis=1)  # row r: replica r
    k = len(factors)
    kernel_grads = []
    for (x, dy), xs, dys in zip(factors, rows[:k], rows[k:2 * k]):
        xs = tf.reshape(xs, [replicas * x.shape[0], x.shape[1]])
        dys = tf.reshape(dys, [replicas * dy.shape[0], dy.shape[1]])
        # bfloat16 factors stay bfloat16 in the matmul (AMX where the CPU has it).
        kernel_grads.append(tf.cast(tf.matmul(xs, dys, transpose_a=True), tf.float32))
    summed = [tf.reshape(tf.reduce_sum(tf.cast(r, tf.float32), axis=0), g.shape)
              for r, g in zip(rows[2 * k:], grads)]
    return summed, kernel_grads


def describe_exchange(settings: AllReduceSettings, factored: list) -> str:
    """One line for the log, e.g. 'factors bfloat16 (dense 3136x1024)'."""
    if not factored:
        return f"allreduce {settings.wire_dtype}"
    shapes = ", ".join("x".join(str(n) for n in layer.kernel.shape) for layer in factored)
    return f"factors {settings.factor_dtype} (dense {shapes})"
