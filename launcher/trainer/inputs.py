"""tf.data pipelines: each worker reads its own shard of a seeded, step-addressable order.

The global example order is a fixed function of (seed, epoch): epoch e is a stateless
permutation of the training set. Position p of that endless stream (counted from where the
run resumes) goes to input pipeline p % num_pipelines. So a run resumed at example e
starts exactly where the uninterrupted run would be, with any number of workers, and W
workers with batch B see the same examples per step as one worker with batch W*B.
"""

from __future__ import annotations

import math

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True
    # We shard by hand; the strategy must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def _to_batch(images: tf.Tensor, labels: tf.Tensor):
    def gather(indices):
        x = tf.cast(tf.gather(images, indices), tf.float32) * (1.0 / 255.0)
        return x[..., tf.newaxis], tf.gather(labels, indices)
    return gather


def train_dataset(images, labels, *, seed: int, start_example: int, global_batch_size: int,
                  input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    n = images.shape[0]
    first_epoch, offset = divmod(start_example, n)
    images = tf.constant(images)
    labels = tf.constant(labels)

    def epoch_order(epoch):
        keys = tf.random.stateless_uniform([n], seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        return tf.data.Dataset.from_tensor_slices(tf.argsort(keys))

    batch = input_context.get_per_replica_batch_size(global_batch_size)
    ds = (tf.data.Dataset.range(first_epoch, 2**62)
          .flat_map(epoch_order)
          .skip(offset)
          .shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
          .batch(batch, drop_remainder=True)
          .map(_to_batch(images, labels), num_parallel_calls=AUTOTUNE)
          .prefetch(AUTOTUNE))
    return ds.with_options(_options())


def eval_steps(num_examples: int, global_batch_size: int, requested: int | None) -> int:
    """Batches per evaluation: the whole test set unless fewer are requested."""
    whole = math.ceil(num_examples / global_batch_size)
    return whole if requested is None else min(requested, whole)


def eval_dataset(images, labels, *, steps: int, global_batch_size: int,
                 input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """`steps` batches on every pipeline; padding examples beyond the set carry weight 0.

    Every worker must run the same number of steps (they meet in collectives), so the
    test set is padded up to steps * global_batch_size rather than split unevenly.
    """
    n = images.shape[0]
    images = tf.constant(images)
    labels = tf.constant(labels)
    gather = _to_batch(images, labels)

    def with_weights(positions):
        x, y = gather(tf.minimum(positions, n - 1))
        return x, y, tf.cast(positions < n, tf.float32)

    batch = input_context.get_per_replica_batch_size(global_batch_size)
    ds = (tf.data.Dataset.range(steps * global_batch_size)
          .shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
          .batch(batch, drop_remainder=True)
          .map(with_weights, num_parallel_calls=AUTOTUNE)
          .prefetch(AUTOTUNE))
    return ds.with_options(_options())
