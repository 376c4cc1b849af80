"""A Keras 3 model trained with a custom loop under MultiWorkerMirroredStrategy.

Keras 3's `model.fit` does not run under MultiWorkerMirroredStrategy; a custom loop does
(this is the pattern of TensorFlow's "Custom training loop with MultiWorkerMirroredStrategy"
tutorial, and what `mgpu train` does). No tf_keras needed:

    mgpu launch --local 2 -- python examples/keras_custom_loop.py --model-dir /tmp/loop-run

A tf.train.Checkpoint is saved every --checkpoint-every steps; a restarted cluster
(`--max-restarts`) resumes from the latest one. The data is synthetic (a learnable pattern
per class plus noise), so the program needs no download.
"""

import argparse
import os
import shutil
import sys
import tempfile

# Where JAX is installed too, `import tensorflow` imports it (for TensorFlow Lite's JAX converter):
# half a CPU-second and about 110 MB in every task, for nothing this program does. Marked absent,
# it is skipped.
sys.modules.setdefault("jax", None)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="Checkpoints go here.")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch-size-per-replica", type=int, default=32)
    return parser.parse_args(argv)


def synthetic_data(examples=2048, features=32, classes=4, seed=0):
    """A learnable set: each class has a fixed pattern, each example is its pattern plus noise."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(size=(classes, features)).astype("float32")
    labels = rng.integers(0, classes, size=examples)
    images = patterns[labels] + 0.5 * rng.normal(size=(examples, features)).astype("float32")
    return images, labels.astype("int64")


def is_chief(strategy):
    """The task whose checkpoints are kept: the chief, or worker 0 in a cluster without one."""
    resolver = strategy.cluster_resolver
    if resolver is None or not resolver.task_type:
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "chief" or (not has_chief and resolver.task_type == "worker" and resolver.task_id == 0)


def main(argv=None):
    args = parse_args(argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.batch_size_per_replica * strategy.num_replicas_in_sync
    images, labels = synthetic_data()
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(images), seed=0).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset.batch(global_batch)))

    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=images.shape[1:]),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
        optimizer = keras.optimizers.Adam()
        step = tf.Variable(0, dtype=tf.int64, trainable=False)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    # Every worker saves (saving is collective); only the chief's directory is kept.
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    chief = is_chief(strategy)
    directory = os.path.join(args.model_dir, "checkpoints") if chief else tempfile.mkdtemp(prefix="loop-worker-")
    manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2)
    # Every worker restores from the chief's directory, so all start at the same step.
    latest = tf.train.latest_checkpoint(os.path.join(args.model_dir, "checkpoints"))
    if latest:
        checkpoint.restore(latest)
        print(f"loop: resumed from {latest} at step {int(step.numpy())}", flush=True)

    @tf.function
    def train_step(batch):
        def replica_step(features, targets):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(targets, model(features, training=True)),
                                                  global_batch_size=global_batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        losses = strategy.run(replica_step, args=batch)
        step.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    while int(step.numpy()) < args.steps:
        loss = train_step(next(iterator))
        done = int(step.numpy())
        if done % args.log_every == 0 or done == args.steps:
            print(f"loop: step {done}/{args.steps} loss {float(loss):.4f}", flush=True)
        if done % args.checkpoint_every == 0 or done == args.steps:
            manager.save(checkpoint_number=done)
    if chief:
        print(f"loop: finished at step {int(step.numpy())}; checkpoints in {directory}", flush=True)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
