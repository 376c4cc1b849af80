"""When the trainer does what: the pure part of the train-and-evaluate loop (controller.py).

Training runs in chunks that end at the next boundary: a log line, an evaluation, a checkpoint,
the end of the warm-up, or --steps-per-loop. No TensorFlow here: the schedule is tested in
milliseconds, and every worker computes the same one, as its collectives require.
"""

from __future__ import annotations

import dataclasses

from launcher import protocol

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

    def checkpoint_due(self, step: int, evaluated: bool, stopping: bool) -> bool:
        """Whether to save after `step`: on its own schedule, or (without one) after each evaluation,
        and whenever training stops early."""
        if stopping:
            return True
        if self.checkpoint_every is None:
            return evaluated
        return self.due(self.checkpoint_every, step)

    def next_stop(self, step: int, warmup_end: int) -> int:
        stops = [self.train_steps, step + self.steps_per_loop]
        for every in (self.log_every, self.eval_every, self.checkpoint_every):
            if every:
                stops.append((step // every + 1) * every)
        if step < warmup_end:
            stops.append(warmup_end)
        return min(stops)


@dataclasses.dataclass
class Throughput:
    """Steps and seconds spent in training calls: since the last log line, after warm-up
    (for the final figure), and in all."""

    warmup_end: int
    window_steps: int = 0
    window_seconds: float = 0.0
    timed_steps: int = 0
    timed_seconds: float = 0.0
    total_steps: int = 0
    total_seconds: float = 0.0

    def add(self, first_step: int, steps: int, seconds: float) -> None:
        if first_step >= self.warmup_end:
            self.timed_steps += steps
            self.timed_seconds += seconds
        self.window_steps += steps
        self.window_seconds += seconds
        self.total_steps += steps
        self.total_seconds += seconds

    def window_rate(self, global_batch_size: int) -> float:
        """Examples per second since the last call; starts a new window."""
        rate = self.window_steps * global_batch_size / max(self.window_seconds, 1e-9)
        self.window_steps, self.window_seconds = 0, 0.0
        return rate

    def final_rate(self, global_batch_size: int) -> float:
        """Examples per second after warm-up; of every step if the run was too short to warm up."""
        steps, seconds = self.timed_steps, self.timed_seconds
        if steps == 0:
            steps, seconds = self.total_steps, self.total_seconds
        return steps * global_batch_size / seconds if seconds else 0.0


# Seconds between two time-split lines of a worker (protocol.time_split_line).
TIME_SPLIT_INTERVAL = 3.0


@dataclasses.dataclass
class TimeSplit:
    """Where a worker's time in training calls went since its last report: waiting in the gradient
    exchange's collectives (from the moment what it sends was ready to the moment they were back),
    or else computing (its input, forward and backward pass, optimizer step).

    `add` answers a protocol time-split line once `interval` seconds have passed since the last one."""

    last_report: float  # the clock when counting began (or the last line)
    interval: float = TIME_SPLIT_INTERVAL
    compute: float = 0.0
    wait: float = 0.0

    def add(self, seconds: float, waited: float, now: float) -> str | None:
        """A training call of `seconds`, of which its steps `waited` in the exchange, ending at `now`."""
        waited = min(max(waited, 0.0), seconds)
        self.compute += seconds - waited
        self.wait += waited
        if now - self.last_report < self.interval:
            return None
        return self.report(now)

    def report(self, now: float) -> str | None:
        """The line for the time since the last one (None if no training call ended since); starts anew."""
        if self.compute == 0.0 and self.wait == 0.0:
            return None
        line = protocol.time_split_line(round(self.compute * 1000), round(self.wait * 1000))
        self.compute, self.wait, self.last_report = 0.0, 0.0, now
        return line
