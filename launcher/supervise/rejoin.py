"""Taking back a host the run went on without (--min-hosts): the pure rule, fed what was seen with
the time it was seen, as the policy is (it never reads the clock).

A host dropped with no spare for it is probed again (a fresh login and the host check, in the
background: the run never waits for it) at most every `interval` seconds. Once it passes, it is
back: it joins the cluster at the next restart, whatever causes it; and where the program reports
its checkpoints (protocol.CHECKPOINT_PREFIX), the supervisor restarts to grow right after one, at
most once per interval, so that little work is lost. A host that was taken back and is left out
again is left out for good: a host that comes and goes would cost a restart each time.
"""

from __future__ import annotations

from typing import Iterable


class Rejoin:
    def __init__(self, interval: float):
        self.interval = interval  # 0: never probed, never taken back
        self._next_probe: dict[str, float] = {}  # hosts out, and when each may be probed next
        self._probing: set[str] = set()
        self.back: list[str] = []  # passed their probe: they join at the next restart
        self._taken_back: set[str] = set()
        self._last_grow = float("-inf")

    def left_out(self, hosts: Iterable[str], now: float) -> None:
        """`hosts` were dropped at `now`: each is probed from `now + interval` on, unless it was
        taken back before (then it stays out)."""
        for host in hosts:
            if host in self.back:
                self.back.remove(host)
            if self.interval and host not in self._taken_back:
                self._next_probe[host] = now + self.interval

    def forgotten(self, host: str) -> bool:
        """Whether `host` is left out for good (taken back once, then left out again)."""
        return host in self._taken_back and host not in self._next_probe and host not in self.back

    def due(self, now: float) -> tuple[str, ...]:
        """The hosts to probe now (each is then being probed until `probed`)."""
        hosts = tuple(host for host, at in self._next_probe.items() if at <= now and host not in self._probing)
        self._probing.update(hosts)
        return hosts

    def next_probe_at(self) -> float:
        return min((at for host, at in self._next_probe.items() if host not in self._probing), default=float("inf"))

    def probed(self, host: str, passed: bool, now: float) -> bool:
        """A probe of `host` ended at `now`; True when the host is newly back."""
        self._probing.discard(host)
        if host not in self._next_probe:
            return False
        if not passed:
            self._next_probe[host] = now + self.interval
            return False
        del self._next_probe[host]
        self.back.append(host)
        return True

    def grow_now(self, checkpoints_since: int, now: float) -> bool:
        """Whether to restart now to take back the hosts that are back: a checkpoint was reported
        since the last look, and the last such restart was an interval ago or more."""
        return bool(self.back) and checkpoints_since > 0 and now - self._last_grow >= self.interval

    def taken_back(self, hosts: Iterable[str], now: float) -> None:
        """`hosts` joined the cluster at a restart at `now`."""
        for host in hosts:
            if host in self.back:
                self.back.remove(host)
            self._taken_back.add(host)
        self._last_grow = now
