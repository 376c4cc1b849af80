"""Baseline: a plain Keras `model.fit` of the seed CNN in one process, one thread.

Prints one JSON object with examples_per_sec over the batches after warm-up, for comparing
with `mgpu train`'s single-worker metrics.json examples_per_sec at the same batch.

Usage: python benchmarks/keras_fit_baseline.py [--steps 300] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import json
import os
import time


def process_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    from launcher.trainer import datasets, models

    data = datasets.synthetic()
    images = data.train_images[..., None].astype("float32") / 255.0
    labels = data.train_labels.astype("int64")
    repeats = -(-args.steps * args.batch_size // len(images))
    dataset = (tf.data.Dataset.from_tensor_slices((images, labels)).repeat(repeats).shuffle(10_000, seed=1)
               .batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    model = models.build("cnn")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == args.warmup - 1:
                self.start, self.cpu_start = time.perf_counter(), process_cpu_seconds()
            elif batch == args.steps - 1:
                self.seconds = time.perf_counter() - self.start
                self.cpu_seconds = process_cpu_seconds() - self.cpu_start

    timer = Timer()
    model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[timer])
    timed = args.steps - args.warmup
    print(json.dumps({"examples_per_sec": timed * args.batch_size / timer.seconds, "steps": args.steps,
                      # every thread of the process, as benchmarks/mwms_scaling.py counts it
                      "cpu_ms_per_step": round(1000 * timer.cpu_seconds / timed, 2),
                      "batch_size": args.batch_size, "threads": args.threads}))


if __name__ == "__main__":
    main()
