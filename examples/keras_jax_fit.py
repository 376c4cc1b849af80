"""Keras 3 `model.fit` across workers on the JAX backend, launched by mgpu.

    mgpu launch --local 2 -- python examples/keras_jax_fit.py
    mgpu launch --workers h1:2222,h2:2222 -- python3 keras_jax_fit.py --epochs 5

Needs `pip install keras "jax[cpu]"` (or `jax[cuda12]` on GPU hosts) on every host; TensorFlow is
not used. mgpu sets, for every chief and worker task, the three variables that
`keras.distribution.initialize()` reads: KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator,
process 0, first), KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID, and on hosts
without GPUs JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo. Without them the program trains alone.

Every process builds the same synthetic data set and feeds its own shard (every n-th example) to
`fit`; DataParallel replicates the weights and sums the gradients of all processes each step, so
every process ends with the same weights. The last line each process prints is `RESULT {json}`
with the weights' SHA-256, the final loss and accuracy, and the examples per second and the
process's CPU milliseconds per step after the first epoch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"  # before keras is imported: this program is for the JAX backend
# Keras also seeds TensorFlow's generator whenever TensorFlow is importable, and initialize() seeds:
# that would import all of TensorFlow (seconds of CPU, hundreds of MB) into every process of a program
# that never uses it. Nothing here uses tf.data, so TensorFlow is kept out.
sys.modules.setdefault("tensorflow", None)

import keras  # noqa: E402
import numpy as np  # noqa: E402

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("cnn", "small"), default="small",
                        help="cnn: conv5x5x32, max-pool, conv5x5x64, max-pool, dense 1024, dropout, dense 10; "
                             "small: one small conv layer (default, for quick runs)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--batch-size-per-replica", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic data")
    return parser.parse_args(argv)


def join_job() -> tuple[int, int]:
    """Join the multi-process job that mgpu describes; (process id, number of processes)."""
    if "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
        # Reads KERAS_DISTRIBUTION_*; process 0 starts the coordinator at the first job address.
        keras.distribution.initialize()
        # JAX turns SIGTERM into a preemption notice and carries on. This program saves no
        # checkpoint, so SIGTERM (how mgpu stops a task when another one failed) ends it at once.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import jax

    return jax.process_index(), jax.process_count()


def synthetic_images(num_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable set: one fixed pattern per class plus noise. The same in every process."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(size=(NUM_CLASSES, *IMAGE_SHAPE)).astype("float32")
    labels = rng.integers(0, NUM_CLASSES, size=num_examples)
    images = patterns[labels] + rng.normal(scale=2.0, size=(num_examples, *IMAGE_SHAPE)).astype("float32")
    return images.astype("float32"), labels.astype("int32")


def build_model(name: str) -> keras.Model:
    layers = keras.layers
    if name == "cnn":
        body = [layers.Conv2D(32, 5, padding="same", activation="relu"), layers.MaxPooling2D(),
                layers.Conv2D(64, 5, padding="same", activation="relu"), layers.MaxPooling2D(),
                layers.Flatten(), layers.Dense(1024, activation="relu"), layers.Dropout(0.4)]
    else:
        body = [layers.Conv2D(8, 3, strides=2, activation="relu"), layers.Flatten()]
    return keras.Sequential([keras.Input(IMAGE_SHAPE), *body, layers.Dense(NUM_CLASSES)])


class Throughput(keras.callbacks.Callback):
    """Examples per second, and this process's CPU time per step (every thread), over every epoch
    but the first (which compiles)."""

    def __init__(self, examples_per_epoch: int, steps_per_epoch: int):
        super().__init__()
        self.examples_per_epoch = examples_per_epoch
        self.steps_per_epoch = steps_per_epoch
        self.started: tuple[float, float] | None = None  # wall and CPU clock after the first epoch
        self.epochs = 0

    def on_epoch_end(self, epoch, logs=None):
        if self.started is None:
            self.started = (time.perf_counter(), time.process_time())
        else:
            self.epochs += 1

    def summary(self) -> dict:
        if not self.epochs:
            return {"examples_per_sec": None, "cpu_ms_per_step": None}
        wall, cpu = time.perf_counter() - self.started[0], time.process_time() - self.started[1]
        return {"examples_per_sec": self.epochs * self.examples_per_epoch / wall,
                "cpu_ms_per_step": 1000 * cpu / (self.epochs * self.steps_per_epoch)}


def weights_sha256(model: keras.Model) -> str:
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if os.environ.get("MGPU_TASK_TYPE") == "evaluator":
        # Not a member of the job (mgpu gives it no KERAS_DISTRIBUTION_*): nothing to do here.
        print("keras_jax_fit.py has no evaluator role; the evaluator task exits", flush=True)
        return 0
    process_id, num_processes = join_job()
    devices = keras.distribution.list_devices()
    distribution = keras.distribution.DataParallel(devices=devices)
    distribution.auto_shard_dataset = False  # each process feeds its own shard below
    keras.distribution.set_distribution(distribution)
    # The same initial weights everywhere: initialize() has already given every process one seed.

    replicas = len(devices)
    local_batch = args.batch_size_per_replica * replicas // num_processes
    global_batch = local_batch * num_processes
    images, labels = synthetic_images(global_batch * args.steps_per_epoch, args.seed)
    images, labels = images[process_id::num_processes], labels[process_id::num_processes]

    model = build_model(args.model)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    throughput = Throughput(global_batch * args.steps_per_epoch, args.steps_per_epoch)
    history = model.fit(images, labels, batch_size=local_batch, epochs=args.epochs, shuffle=False,
                        callbacks=[throughput], verbose=2 if process_id == 0 else 0)
    result = {
        "process_id": process_id, "num_processes": num_processes, "replicas": replicas,
        "global_batch_size": global_batch, "loss": history.history["loss"][-1],
        "accuracy": history.history["accuracy"][-1], **throughput.summary(),
        "weights_sha256": weights_sha256(model),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
