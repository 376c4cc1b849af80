"""The gradient all-reduce: the one place where gradients cross replicas and workers.

Called in replica context with this replica's gradients of loss / global_batch_size;
returns their sum over all replicas, which is the gradient of the global mean loss.
Everything that shapes the communication (wire dtype, packing, implementation,
timeout) is decided here, so tuning it touches nothing else.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class AllReduceSettings:
    wire_dtype: str = "float32"  # float32 | float16 | bfloat16
    options: tf.distribute.experimental.CommunicationOptions | None = None


def allreduce_gradients(grads: list[tf.Tensor], settings: AllReduceSettings) -> list[tf.Tensor]:
    ctx = tf.distribute.get_replica_context()
    wire = tf.as_dtype(settings.wire_dtype)
    sent = [g if g.dtype == wire else tf.cast(g, wire) for g in grads]
    # float16 has a narrow range: a gradient below ~6e-8 per replica flushes to zero.
    summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, sent, options=settings.options)
    return [s if s.dtype == g.dtype else tf.cast(s, g.dtype) for s, g in zip(summed, grads)]
