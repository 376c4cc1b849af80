"""The stall clock: when the training tasks were last active. (Activity, not progress: the steps
a program reports are its progress, counted elsewhere; the stall clock needs only a sign of life.)

Activity is any output from a training task (a line, a progress line, a bar being redrawn), or
CPU use: a task whose processes used at least CPU_ACTIVITY_SHARE of one core since the last
sample is working, even when it prints nothing (a long evaluation, a data set being read). A job
whose tasks all wait (in a collective for a peer that blocks in Python, say) prints nothing and
uses almost no CPU: measured on a stalled MultiWorkerMirroredStrategy job, 0.1 to 0.4 % of a
core per task, heartbeats included. Tasks over SSH have their CPU time counted on their host (the
join reporter's samples, backends/ssh/remote_command.py); where a backend cannot count CPU time
(tasks in a Slurm step), output alone counts.

Pure bookkeeping: the supervisor feeds it times and CPU seconds.
"""

from __future__ import annotations

from typing import Hashable

CPU_ACTIVITY_SHARE = 0.1  # of one core, between two samples
MAX_CPU_SAMPLE_INTERVAL = 10.0


class StallClock:
    def __init__(self, timeout: float, now: float):
        self.timeout = timeout
        self.activity_at = now
        # Samples often enough that a stall is seen within a quarter of the timeout.
        self.cpu_sample_interval = min(MAX_CPU_SAMPLE_INTERVAL, timeout / 4)
        self._cpu: dict[Hashable, tuple[float, float]] = {}  # task -> (cpu seconds, when)
        self._measured: set[Hashable] = set()

    def output_seen(self, at: float) -> None:
        self.activity_at = max(self.activity_at, at)

    def cpu_sample(self, task: Hashable, cpu_seconds: float, now: float) -> None:
        """A task's processes had used `cpu_seconds` in all at `now`."""
        previous = self._cpu.get(task)
        self._cpu[task] = (cpu_seconds, now)
        if previous is not None:
            self._measured.add(task)
        if previous is not None and cpu_seconds - previous[0] >= CPU_ACTIVITY_SHARE * (now - previous[1]):
            self.activity_at = max(self.activity_at, now)

    def measured(self, task: Hashable) -> bool:
        """Whether the task's CPU use was measured at least twice, so that "no CPU use" is what was seen."""
        return task in self._measured

    def idle_for(self, now: float) -> float:
        return now - self.activity_at

    def stalled(self, now: float) -> bool:
        return self.idle_for(now) >= self.timeout
