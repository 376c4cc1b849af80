"""What a worker tells the user: log lines, a progress bar, TensorBoard summaries."""

from __future__ import annotations

import os
import sys

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

# TensorBoard's scalar plugin tag, written directly so TensorBoard need not be installed.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))


def write_scalars(writer, step: int, values: dict) -> None:
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.write(name, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)
    writer.flush()


def log(message: str) -> None:
    print(message, flush=True)


def format_metrics(values: dict) -> str:
    parts = []
    for key, value in values.items():
        if isinstance(value, float):
            value = f"{value:.1f}" if key == "examples/sec" else f"{value:.4f}"
        parts.append(f"{key}={value}")
    return " ".join(parts)


class ProgressBar:
    """A one-line bar redrawn in place; only when stdout is a terminal."""

    WIDTH = 30

    def __init__(self, total: int, enabled: bool):
        self._total = total
        self._enabled = enabled
        self._drawn = False

    def update(self, step: int) -> None:
        if not self._enabled:
            return
        done = int(self.WIDTH * step / self._total)
        sys.stdout.write(f"\r[{'#' * done}{'.' * (self.WIDTH - done)}] step {step}/{self._total}")
        sys.stdout.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the bar before a log line is printed."""
        if self._drawn:
            sys.stdout.write("\r" + " " * (self.WIDTH + 40) + "\r")
            sys.stdout.flush()
            self._drawn = False


class Reporter:
    """Log lines and summaries of the chief; other workers stay quiet."""

    def __init__(self, is_chief: bool, model_dir: str | None, train_steps: int):
        self._is_chief = is_chief
        self.progress = ProgressBar(train_steps, enabled=is_chief and sys.stdout.isatty())
        self._writers = {}
        if is_chief and model_dir is not None:
            for kind in ("train", "eval"):
                self._writers[kind] = tf.summary.create_file_writer(os.path.join(model_dir, kind))

    def line(self, message: str) -> None:
        if self._is_chief:
            self.progress.clear()
            log(message)

    def scalars(self, kind: str, step: int, values: dict) -> None:
        writer = self._writers.get(kind)
        if writer is None:
            return
        write_scalars(writer, step, values)

    def close(self) -> None:
        self.progress.clear()
        for writer in self._writers.values():
            writer.close()
