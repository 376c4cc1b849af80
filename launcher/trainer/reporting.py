"""What a worker tells the user: log lines, a progress bar, TensorBoard summaries."""

from __future__ import annotations

import os
import sys
import time

import tensorflow as tf

from launcher import protocol
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
    """The chief's progress. Under `mgpu launch`: protocol progress lines, at most one a second,
    which the launcher draws as a bar with rate and ETA. On a terminal: a tqdm bar. Else nothing."""

    INTERVAL = 1.0

    def __init__(self, total: int, enabled: bool):
        self._total = total
        self._to_launcher = enabled and protocol.ENV_RUN_ID in os.environ
        self._terminal = enabled and not self._to_launcher and sys.stdout.isatty()
        self._bar = None
        self._reported_at = float("-inf")

    def update(self, step: int) -> None:
        if self._to_launcher:
            now = time.monotonic()
            if now - self._reported_at >= self.INTERVAL or step >= self._total:
                self._reported_at = now
                print(protocol.progress_line(step, self._total), flush=True)
        elif self._terminal:
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(total=self._total, initial=step, unit=" steps", file=sys.stdout, leave=False)
            self._bar.update(step - self._bar.n)

    def clear(self) -> None:
        """Erase the bar before a log line is printed (it comes back at the next update)."""
        if self._bar is not None:
            self._bar.clear()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class Reporter:
    """Log lines and summaries of the chief; other workers say only, under `mgpu launch`, how
    their time splits between computing and waiting for the others."""

    def __init__(self, is_chief: bool, model_dir: str | None, train_steps: int):
        self._is_chief = is_chief
        self._to_launcher = protocol.ENV_RUN_ID in os.environ
        self.progress = ProgressBar(train_steps, enabled=is_chief)
        self._writers = {}
        if is_chief and model_dir is not None:
            for kind in ("train", "eval"):
                self._writers[kind] = tf.summary.create_file_writer(os.path.join(model_dir, kind))

    def line(self, message: str) -> None:
        if self._is_chief:
            self.progress.clear()
            log(message)

    def time_split(self, line: str | None) -> None:
        """Every worker's protocol time-split line (schedule.TimeSplit), for the launcher only."""
        if line is not None and self._to_launcher:
            log(line)

    def scalars(self, kind: str, step: int, values: dict) -> None:
        writer = self._writers.get(kind)
        if writer is None:
            return
        write_scalars(writer, step, values)

    def close(self) -> None:
        self.progress.close()
        for writer in self._writers.values():
            writer.close()
