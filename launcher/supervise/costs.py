"""What a run's failures cost: per attempt, when all its tasks were ready, the progress it reported
and the time it lost; in all, the restarts, the hosts left out, the time lost and the goodput
(run.json and the closing line)."""

from __future__ import annotations

import dataclasses
import time

from launcher.supervise import causes, policy
from launcher.supervise.attempt import Attempt
from launcher.supervise.runrecord import RunRecord, utc
from launcher.supervise.sizes import SizeChange
from launcher.supervise.status import INTERRUPTED, SUCCEEDED


@dataclasses.dataclass
class Cost:
    """A failed attempt that was restarted: why, when, the time it lost, the host left out."""
    cause: causes.Cause
    at: float  # seconds since the epoch
    lost: float
    left_out: bool = False
    took: str | None = None  # "h5 took worker:1": the spare that took the left-out host's tasks
    others: tuple[tuple[causes.Cause, str | None], ...] = ()  # the other hosts left out with it, and who took theirs
    resized: SizeChange | None = None  # the run went on on fewer hosts (--min-hosts)


class RunCosts:
    def __init__(self) -> None:
        self.best_step: int | None = None  # the highest step any attempt reported
        self.costs: list[Cost] = []  # one per failed attempt that was restarted

    def attempt_ended(self, attempt: Attempt, started: float, stop: policy.Stop, record: RunRecord) -> float:
        """The attempt's ready time, progress and time lost, into its record; returns the time lost.

        A failed attempt loses the time since its last new step (the work after it is redone), or
        all of it when it reported no step beyond the best before it."""
        tasks = attempt.tasks
        progress = attempt.progress()
        ended = time.time()
        training = [t for t in tasks if not t.sidecar] or tasks
        ready_times = [t.ready_at for t in training]
        ready = max(ready_times) if ready_times and None not in ready_times else None
        gained = None
        if progress is not None:
            gained = max(0, progress - (self.best_step or 0))
        lost = 0.0
        if stop.status not in (SUCCEEDED, INTERRUPTED):  # an interrupted run was ended on purpose
            last_new = None
            if gained:
                last_new = max((t.output.progress.step_at for t in tasks if t.output.progress.step == progress),
                               default=None)
            lost = max(0.0, ended - (last_new or started))
        record.attempt_costs(
            ready_at=utc(ready) if ready is not None else None,
            progress={"last_step": progress, "gained": gained} if progress is not None else None,
            time_lost_s=round(lost, 3))
        return lost

    def progressed(self, progress: int | None) -> None:
        if progress is not None:
            self.best_step = max(progress, self.best_step or 0)

    def lost(self) -> float:
        return sum(c.lost for c in self.costs)

    def totals(self, wall: float) -> dict:
        lost = self.lost()
        return {
            "restarts": len(self.costs),
            "left_out": [{"host": cause.host, "cause": cause.kind, "at": utc(c.at), "replaced_by": took}
                         for c in self.costs for cause, took in ((c.cause, c.took),) * c.left_out + c.others],
            "time_lost_s": round(lost, 3),
            "wall_s": round(wall, 3),
            "goodput": round(max(0.0, wall - lost) / wall, 4) if wall > 0 else None,
        }
