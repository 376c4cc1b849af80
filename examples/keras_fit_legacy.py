"""Keras `model.fit` on several workers, through tf_keras (Keras 2), with BackupAndRestore.

Keras 3's `model.fit` does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585);
tf_keras does. `mgpu launch --legacy-keras` sets TF_USE_LEGACY_KERAS=1 for every task, which
makes `tf.keras` mean tf_keras (`pip install 'mgpu[legacy-keras]'` or `pip install tf-keras`
matching your TensorFlow).

    mgpu launch --local 2 --legacy-keras --max-restarts 1 -- \
        python examples/keras_fit_legacy.py --model-dir /tmp/fit-run

BackupAndRestore saves the training state at the end of every epoch in
MODEL_DIR/backup; when mgpu restarts the cluster after a failure, fit resumes from the
last finished epoch. The data is synthetic (a learnable pattern per class plus noise),
so the program needs no download.
"""

import argparse
import importlib.metadata
import os
import shutil
import sys
import tempfile

# Where JAX is installed too, `import tensorflow` imports it (for TensorFlow Lite's JAX converter):
# half a CPU-second and about 110 MB in every task, for nothing this program does. Marked absent,
# it is skipped.
sys.modules.setdefault("jax", None)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="Backups and the trained model go here.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--batch-size-per-replica", type=int, default=32)
    parser.add_argument("--examples", type=int, default=2048, help="Size of the synthetic training set.")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=0,
                        help="Keras' own output: 1 is its progress bar, redrawn with \\r (mgpu shows it live).")
    return parser.parse_args(argv)


def synthetic_data(examples, features=32, classes=4, seed=0):
    """A learnable set: each class has a fixed pattern, each example is its pattern plus noise."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(size=(classes, features)).astype("float32")
    labels = rng.integers(0, classes, size=examples)
    images = patterns[labels] + 0.5 * rng.normal(size=(examples, features)).astype("float32")
    return images, labels.astype("int64")


class EpochLog(tf.keras.callbacks.Callback):
    """One plain line per epoch, and the epoch fit started at. On stderr: Keras' bar (--verbose 1)
    is still on its line on stdout when on_epoch_end runs."""

    def __init__(self):
        super().__init__()
        self.first = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first is None:
            self.first = epoch
            print(f"fit: starting at epoch {epoch + 1}", file=sys.stderr, flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print(f"fit: epoch {epoch + 1} done, loss {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f}",
              file=sys.stderr, flush=True)


def is_chief(strategy):
    """The task that writes the final model: the chief, or worker 0 in a cluster without one."""
    resolver = strategy.cluster_resolver
    if resolver is None or not resolver.task_type:
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "chief" or (not has_chief and resolver.task_type == "worker" and resolver.task_id == 0)


def main(argv=None):
    args = parse_args(argv)
    keras_package = tf.keras.__name__.split(".")[0]  # tf_keras with TF_USE_LEGACY_KERAS=1, else keras (Keras 3)
    print(f"fit: {keras_package} {importlib.metadata.version(keras_package.replace('_', '-'))}", flush=True)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = args.batch_size_per_replica * strategy.num_replicas_in_sync
    images, labels = synthetic_data(args.examples)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(images), seed=0).repeat()
    dataset = dataset.batch(global_batch)

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=images.shape[1:]),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(4),
        ])
        model.compile(optimizer="adam",
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(args.model_dir, "backup"))
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              callbacks=[backup, EpochLog()], verbose=args.verbose)

    # Every worker must save (saving is a collective); only the chief's copy is kept.
    chief = is_chief(strategy)
    target = os.path.join(args.model_dir, "model") if chief else tempfile.mkdtemp(prefix="fit-worker-")
    model.save(target)
    if chief:
        print(f"fit: model saved to {target}", flush=True)
    else:
        shutil.rmtree(target, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
