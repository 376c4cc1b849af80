"""Taking back hosts the run went on without (--min-hosts, --rejoin-interval): the supervisor's side
of rejoin.py's rule. Each probe (HostActions.probe_back: a fresh login and the host check) runs in
a thread of its own, so the run never waits for a host that does not answer; what the probes found
and the checkpoints the tasks reported are fed to the rule on each look of the attempt's loop."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Sequence

from launcher.plan.planner import TaskPlan
from launcher.supervise import sizes
from launcher.supervise.hosts import HostActions
from launcher.supervise.notify import Notifier
from launcher.supervise.rejoin import Rejoin
from launcher.supervise.runrecord import RunRecord


class TakeBack:
    def __init__(self, hosts: HostActions, interval: float, notice: Callable[[str], None], notifier: Notifier):
        self.hosts = hosts
        self.notifier = notifier
        self.rule = Rejoin(interval)
        self.notice = notice
        self._found: queue.Queue[tuple[str, bool]] = queue.Queue()
        self._checkpoints = 0  # reported in the attempt so far, as last looked at
        self.growths: list[sizes.SizeChange] = []  # each time hosts were taken back

    def begin_attempt(self) -> None:
        self._checkpoints = 0

    def now(self, tasks, clock: Callable[[], float]) -> bool:
        """Whether to stop the attempt now to take back the hosts that are back (said when so):
        `tasks` are the attempt's, whose checkpoint lines are counted. The clock is read only where
        hosts may be taken back."""
        if not self.rule.interval:
            return False
        if not self.look(sum(task.output.checkpoints.count for task in tasks), clock()):
            return False
        self.notice(f"taking back {', '.join(self.rule.back)} after the checkpoint just reported; stopping all tasks")
        return True

    def look(self, checkpoints: int, now: float) -> bool:
        """Start the probes that are due, take in those that ended; whether to restart now to take
        back the hosts that are back (`checkpoints`: how many the attempt's tasks reported so far)."""
        for host in self.rule.due(now):
            threading.Thread(target=self._probe, args=(host,), name=f"probe-{host}", daemon=True).start()
        while True:
            try:
                host, passed = self._found.get_nowait()
            except queue.Empty:
                break
            if self.rule.probed(host, passed, now):
                self.notice(f"{host} answers again and passed its checks: it joins the cluster at the next restart "
                            f"(right after the next checkpoint the program reports)")
        new, self._checkpoints = checkpoints - self._checkpoints, checkpoints
        return self.rule.grow_now(new, now)

    def _probe(self, host: str) -> None:
        try:
            passed = self.hosts.probe_back(host)
        except Exception:  # noqa: BLE001 - a probe that breaks is a host that did not pass
            passed = False
        self._found.put((host, passed))

    def left_out(self, hosts: Sequence[str], clock: Callable[[], float]) -> None:
        """`hosts` were dropped (none: nothing to do, the clock not read)."""
        if hosts:
            self.rule.left_out(hosts, clock())

    def take_in(self, plans: Sequence[TaskPlan], planned: int, record: RunRecord,
                now: float) -> tuple[list[TaskPlan], sizes.SizeChange | None]:
        """The hosts back join the cluster: the plans made again with their tasks and made ready
        (sizes.grow), or `plans` as they are when that fails (the hosts stay out, probed again later)."""
        back = list(self.rule.back)
        grown, change = sizes.grow(self.hosts, back, plans, planned, record, self.notice, self.notifier)
        if grown is None:
            self.rule.left_out(back, now)
            return list(plans), None
        self.rule.taken_back(back, now)
        self.growths.append(change)
        return list(grown), change
