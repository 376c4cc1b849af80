"""What a run's failures cost: per attempt, when all its tasks were ready, the progress it reported
and the time it lost by cause; in all, the restarts, the hosts left out, the time lost by cause and
the goodput (run.json, the closing line and `mgpu status`). The split itself is lost_time.py's."""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Sequence

from launcher.supervise import causes, lost_time, policy
from launcher.supervise.attempt import Attempt
from launcher.supervise.runrecord import RunRecord, utc
from launcher.supervise.sizes import SizeChange
from launcher.supervise.status import INTERRUPTED, STALLED, SUCCEEDED


@dataclasses.dataclass
class Cost:
    """A failed attempt that was restarted: why, when, the time it lost, the host left out."""
    cause: causes.Cause
    at: float  # seconds since the epoch
    lost: float
    left_out: bool = False
    took: str | None = None  # "h5 took worker:1": the spare that took the left-out host's tasks
    others: tuple[tuple[causes.Cause, str | None], ...] = ()  # the other hosts left out with it, and who took theirs
    restarted: bool = True  # False: the run stopped there (a host left out without a spare)
    resized: SizeChange | None = None  # the run went on on fewer hosts (--min-hosts)


class RunCosts:
    def __init__(self) -> None:
        self.best_step: int | None = None  # the highest step any attempt reported
        self.costs: list[Cost] = []  # one per failed attempt that was restarted or left a host out
        self.started = time.time()
        self.attempts: list[lost_time.AttemptTimes] = []
        self._began = self._ended = self.started  # the attempt under way's start, the last one's end
        self._totals: dict | None = None

    def attempt_ended(self, attempt: Attempt, stop: policy.Stop, record: RunRecord) -> float:
        """The attempt's ready time, progress and lost time by cause (lost_time.py), into its record
        (and the run's costs so far, for `mgpu status`); returns the time it lost."""
        tasks = attempt.tasks
        progress = attempt.progress()
        started, ended = self._began, self._ended
        training = [t for t in tasks if not t.sidecar] or tasks
        ready_times = [t.ready_at for t in training]
        ready = max(ready_times) if ready_times and None not in ready_times else None
        gained = None
        if progress is not None:
            gained = max(0, progress - (self.best_step or 0))
        times = lost_time.AttemptTimes(
            started, ended, failed=stop.status not in (SUCCEEDED, INTERRUPTED),  # an interruption was on purpose
            best_before=self.best_step, steps=step_times(attempt, progress, self.best_step),
            stalled_for=stop.idle_for if stop.status == STALLED else 0.0,
            restart_before=started - self.attempts[-1].ended if self.attempts else 0.0)
        self.attempts.append(times)
        figures = lost_time.attempt_record(lost_time.attempt_split(times))
        record.run_costs(self._figures(ended))
        record.attempt_costs(
            ready_at=utc(ready) if ready is not None else None,
            progress={"last_step": progress, "gained": gained} if progress is not None else None,
            **figures)
        return figures["time_lost_s"]

    def begin(self) -> float:
        """An attempt starts now: returns the time."""
        self._began = time.time()
        return self._began

    def end(self) -> float:
        """The attempt has ended (all its tasks stopped) now: returns the time."""
        self._ended = time.time()
        return self._ended

    def live(self, attempt: Attempt, now: float) -> dict:
        """The run's costs at `now`, the attempt under way counted as if it ended then (its time
        since its last new step under finish): for the samples."""
        times = lost_time.AttemptTimes(
            self._began, now, failed=False, best_before=self.best_step,
            steps=step_times(attempt, attempt.progress(), self.best_step),
            restart_before=self._began - self.attempts[-1].ended if self.attempts else 0.0)
        return self._figures(now, [times])

    def progressed(self, progress: int | None) -> None:
        if progress is not None:
            self.best_step = max(progress, self.best_step or 0)

    def lost(self) -> float:
        return sum(c.lost for c in self.costs)

    def totals(self) -> dict:
        """The run's costs, figured once, at the first call: the closing line and run.json say the same."""
        if self._totals is None:
            self._totals = self._figures(time.time())
        return self._totals

    def _figures(self, now: float, under_way: list[lost_time.AttemptTimes] = ()) -> dict:
        return {
            "restarts": sum(c.restarted for c in self.costs),
            "left_out": [{"host": cause.host, "cause": cause.kind, "at": utc(c.at), "replaced_by": took}
                         for c in self.costs for cause, took in ((c.cause, c.took),) * c.left_out + c.others],
            **lost_time.run_split([*self.attempts, *under_way], self.started, now),
        }


def step_times(attempt: Attempt, highest: int | None, best_before: int | None) -> lost_time.StepTimes | None:
    """What the attempt's tasks' step lines showed (watchers.ProgressWatcher), the earliest of them."""
    seen = [t.output.progress for t in attempt.tasks if t.output.progress.first_at is not None]
    if not seen or highest is None:
        return None
    first = min(seen, key=lambda p: p.first_at)
    caught = [p.caught_up_at for p in seen if p.caught_up_at is not None]
    last_new = None
    if best_before is None or highest > best_before:
        last_new = min(p.step_at for p in seen if p.step == highest and p.step_at is not None)
    most = max(seen, key=lambda p: p.rises)
    interval = (most.step_at - most.first_at) / most.rises if most.rises and most.step_at is not None else None
    return lost_time.StepTimes(first.first_at, first.first, min(caught, default=None), last_new, highest, interval)


def resized_story(cost: Cost, costs: Sequence[Cost], growths: Sequence[SizeChange] = ()) -> str | None:
    """For the closing line, a restart that went on on fewer hosts: for how long (until the next
    size change, or now), and when its host was taken back, if it was."""
    if cost.resized is None:
        return None
    at = cost.resized.at
    later = [c.resized.at for c in costs if c.resized is not None and c.resized.at > at]
    later += [growth.at for growth in growths if growth.at > at]
    story = cost.resized.story(min(later, default=time.time()))
    for growth in growths:
        for host in growth.back:
            if growth.at > at and host in cost.resized.dropped:
                story += f"; {host} back at {datetime.datetime.fromtimestamp(growth.at).strftime('%H:%M')}"
    return story
