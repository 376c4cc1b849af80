"""The train-and-evaluate schedule, in the style of orbit's Controller.

Training runs in chunks that end at the next boundary (log, eval, checkpoint, warm-up
end, or --steps-per-loop). Every worker follows the same schedule, because collectives
(metric reads, evaluation, the preemption agreement) must be entered by all of them
at the same step.
"""

from __future__ import annotations

import dataclasses
import time

from launcher.trainer.checkpoints import Checkpointer
from launcher.trainer.preemption import Preempted, PreemptionWatcher
from launcher.trainer.reporting import Reporter, format_metrics
from launcher.trainer.steps import EvalLoop, TrainLoop

# Steps excluded from the throughput figure: tracing and first-touch costs.
WARMUP_STEPS = 5


@dataclasses.dataclass
class Schedule:
    train_steps: int
    steps_per_loop: int
    log_every: int
    eval_every: int | None
    checkpoint_every: int | None
    stop_at_accuracy: float | None

    def due(self, every: int | None, step: int) -> bool:
        return every is not None and step % every == 0

    def next_stop(self, step: int, warmup_end: int) -> int:
        stops = [self.train_steps, step + self.steps_per_loop]
        for every in (self.log_every, self.eval_every, self.checkpoint_every):
            if every:
                stops.append((step // every + 1) * every)
        if step < warmup_end:
            stops.append(warmup_end)
        return min(stops)


@dataclasses.dataclass
class Outcome:
    step: int
    final_eval: dict
    examples_per_sec: float
    stopped_early: bool


class Controller:
    def __init__(self, *, schedule: Schedule, global_batch_size: int, train: TrainLoop,
                 evaluate: EvalLoop, iterator, checkpointer: Checkpointer,
                 watcher: PreemptionWatcher, reporter: Reporter):
        self.schedule = schedule
        self.global_batch_size = global_batch_size
        self.train = train
        self.evaluate = evaluate
        self.iterator = iterator
        self.checkpointer = checkpointer
        self.watcher = watcher
        self.reporter = reporter

    def train_and_evaluate(self, start_step: int) -> Outcome:
        s = self.schedule
        step = start_step
        warmup_end = start_step + WARMUP_STEPS
        timed_steps, timed_seconds = 0, 0.0  # after warm-up, for the final figure
        window_steps, window_seconds = 0, 0.0  # since the last log line
        total_steps, total_seconds = 0, 0.0
        last_eval: dict | None = None
        last_eval_step = None
        stopped_early = False
        self.train.sums.reset()

        while step < s.train_steps:
            target = s.next_stop(step, warmup_end)
            started = time.perf_counter()
            new_step = self.train.run(self.iterator, target - step)
            elapsed = time.perf_counter() - started
            if new_step != target:
                raise RuntimeError(f"step counter is {new_step}, expected {target}")
            if step >= warmup_end:
                timed_steps += target - step
                timed_seconds += elapsed
            window_steps += target - step
            window_seconds += elapsed
            total_steps += target - step
            total_seconds += elapsed
            step = target
            self.reporter.progress.update(step)

            if self.watcher.agreed():
                self.checkpointer.save(step)
                raise Preempted(step)

            if s.due(s.log_every, step) or step == s.train_steps:
                values = self.train.sums.result()
                self.train.sums.reset()
                rate = window_steps * self.global_batch_size / max(window_seconds, 1e-9)
                window_steps, window_seconds = 0, 0.0
                metrics = {"loss": values["loss"], "accuracy": values["accuracy"],
                           "examples/sec": rate}
                self.reporter.line(f"train step={step}/{s.train_steps} {format_metrics(metrics)}")
                self.reporter.scalars("train", step, metrics)

            evaluate_now = s.due(s.eval_every, step)
            if evaluate_now:
                last_eval, last_eval_step = self._evaluate(step), step
                if s.stop_at_accuracy is not None and last_eval["accuracy"] >= s.stop_at_accuracy:
                    self.reporter.line(
                        f"stopping: accuracy {last_eval['accuracy']:.4f} >= {s.stop_at_accuracy}")
                    stopped_early = True
            if stopped_early or (s.checkpoint_every is None and evaluate_now) or s.due(
                    s.checkpoint_every, step):
                self.checkpointer.save(step)
            if stopped_early:
                break

        if last_eval_step != step:
            last_eval = self._evaluate(step)
        self.checkpointer.save(step)
        if timed_steps == 0:  # too short to warm up: report what there is
            timed_steps, timed_seconds = total_steps, total_seconds
        rate = timed_steps * self.global_batch_size / timed_seconds if timed_seconds else 0.0
        return Outcome(step, last_eval, rate, stopped_early)

    def _evaluate(self, step: int) -> dict:
        values = self.evaluate.run()
        metrics = {"loss": values["loss"], "accuracy": values["accuracy"]}
        self.reporter.line(f"eval step={step} {format_metrics(metrics)} "
                           f"examples={int(values['examples'])}")
        self.reporter.scalars("eval", step, metrics)
        return metrics
