"""The train-and-evaluate loop, in the style of orbit's Controller: it trains in chunks up to
the schedule's next boundary (schedule.py) and then does what is due there (log, evaluate,
checkpoint, stop early, leave on preemption). Every worker follows the same schedule, because
collectives (metric reads, evaluation, the preemption agreement) must be entered by all of them
at the same step.
"""

from __future__ import annotations

import dataclasses
import time

from launcher.trainer.checkpoints import Checkpointer
from launcher.trainer.preemption import Preempted, PreemptionWatcher
from launcher.trainer.reporting import Reporter, format_metrics
from launcher.trainer.schedule import WARMUP_STEPS, Schedule, Throughput, TimeSplit
from launcher.trainer.steps import EvalLoop, TrainLoop

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
        throughput = Throughput(warmup_end=start_step + WARMUP_STEPS)
        split = TimeSplit(last_report=time.perf_counter())
        last_eval: dict | None = None
        last_eval_step = None
        stopped_early = False
        self.train.sums.reset()

        while step < s.train_steps:
            target = s.next_stop(step, throughput.warmup_end)
            started = time.perf_counter()
            new_step, waited = self.train.run(self.iterator, target - step)
            ended = time.perf_counter()
            throughput.add(step, target - step, ended - started)
            self.reporter.time_split(split.add(ended - started, waited, ended))
            if new_step != target:
                raise RuntimeError(f"step counter is {new_step}, expected {target}")
            step = target
            self.reporter.progress.update(step)

            if self.watcher.agreed():
                self.checkpointer.save(step)
                raise Preempted(step)

            if s.due(s.log_every, step) or step == s.train_steps:
                self._log_training(step, throughput.window_rate(self.global_batch_size))

            evaluate_now = s.due(s.eval_every, step)
            if evaluate_now:
                last_eval, last_eval_step = self._evaluate(step), step
                if s.stop_at_accuracy is not None and last_eval["accuracy"] >= s.stop_at_accuracy:
                    self.reporter.line(
                        f"stopping: accuracy {last_eval['accuracy']:.4f} >= {s.stop_at_accuracy}")
                    stopped_early = True
            if s.checkpoint_due(step, evaluated=evaluate_now, stopping=stopped_early):
                self.checkpointer.save(step)
            if stopped_early:
                break

        self.reporter.time_split(split.report(time.perf_counter()))
        if last_eval_step != step:
            last_eval = self._evaluate(step)
        self.checkpointer.save(step)
        return Outcome(step, last_eval, throughput.final_rate(self.global_batch_size), stopped_early)

    def _log_training(self, step: int, rate: float) -> None:
        """Collective (reads the training sums): every worker logs at the same steps."""
        values = self.train.sums.result()
        self.train.sums.reset()
        metrics = {"loss": values["loss"], "accuracy": values["accuracy"], "examples/sec": rate}
        self.reporter.line(f"train step={step}/{self.schedule.train_steps} {format_metrics(metrics)}")
        self.reporter.scalars("train", step, metrics)

    def _evaluate(self, step: int) -> dict:
        values = self.evaluate.run()
        metrics = {"loss": values["loss"], "accuracy": values["accuracy"]}
        self.reporter.line(f"eval step={step} {format_metrics(metrics)} "
                           f"examples={int(values['examples'])}")
        self.reporter.scalars("eval", step, metrics)
        return metrics
