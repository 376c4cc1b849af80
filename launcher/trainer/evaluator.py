"""The evaluator task: a sidecar outside the cluster that evaluates each new checkpoint once.

It writes eval summaries to <model-dir>/evaluator and all results to
<model-dir>/eval_results.json, and stops when the final checkpoint is evaluated, or
after --evaluator-timeout seconds without a new checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import time

import tensorflow as tf

from launcher import protocol
from launcher.trainer import builders, models, outdirs
from launcher.trainer import strategy as strategy_lib
from launcher.trainer.datasets import Arrays
from launcher.trainer.options import TrainOptions, global_batch_size
from launcher.trainer.reporting import format_metrics, log, write_scalars

POLL_INTERVAL_S = 1.0
RESULTS_FILE = "eval_results.json"


class _Stop(Exception):
    pass


def _finished_step(model_dir: str) -> int | None:
    """The final step of a finished training run, from the chief's metrics.json."""
    try:
        with open(os.path.join(model_dir, "metrics.json")) as f:
            return int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load_results(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return list(json.load(f)["evaluations"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def run(opts: TrainOptions, arrays: Arrays) -> int:
    strategy_lib.configure_runtime(opts)
    strategy = tf.distribute.get_strategy()
    model = models.build(opts.model)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(model=model, step=step)
    # One replica: the global batch is the training run's global batch, or its per-replica one.
    evaluate = builders.eval_loop(strategy, model, arrays, global_batch_size(opts, replicas=1),
                                  opts.eval_steps)
    writer = tf.summary.create_file_writer(os.path.join(opts.model_dir, "evaluator"))
    results_path = os.path.join(opts.model_dir, RESULTS_FILE)
    evaluations = _load_results(results_path)
    done = {e["checkpoint"] for e in evaluations}

    def on_sigterm(signum, frame):
        raise _Stop()
    signal.signal(signal.SIGTERM, on_sigterm)
    log(protocol.READY_LINE)

    last_new = time.monotonic()
    last_step = evaluations[-1]["step"] if evaluations else None
    try:
        while True:
            path = tf.train.latest_checkpoint(opts.model_dir)
            if path is not None and os.path.basename(path) not in done:
                try:
                    checkpoint.restore(path).expect_partial()
                except (tf.errors.NotFoundError, tf.errors.DataLossError):
                    time.sleep(POLL_INTERVAL_S)  # replaced while we read it; take the next
                    continue
                last_step = int(step.numpy())
                metrics = {k: v for k, v in evaluate.run().items() if k != "examples"}
                log(f"evaluator step={last_step} {format_metrics(metrics)}")
                write_scalars(writer, last_step, metrics)
                done.add(os.path.basename(path))
                evaluations.append({"checkpoint": os.path.basename(path), "step": last_step,
                                    **metrics})
                outdirs.write_json(results_path, {"evaluations": evaluations,
                                                  "final": evaluations[-1]})
                last_new = time.monotonic()
                if last_step >= opts.train_steps:
                    return 0
                continue
            if last_step is not None and _finished_step(opts.model_dir) == last_step:
                return 0  # training stopped early and its last checkpoint is evaluated
            if time.monotonic() - last_new > opts.evaluator_timeout:
                log(f"evaluator: no new checkpoint for {opts.evaluator_timeout:.0f} s; stopping")
                return 0
            time.sleep(POLL_INTERVAL_S)
    except _Stop:
        log("evaluator: stopped by SIGTERM")
        return protocol.EXIT_PREEMPTED
    finally:
        writer.close()
