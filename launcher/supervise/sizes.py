"""The run's size as it changes: each time hosts are left out with no spare to take their tasks
(`--min-hosts`), the run goes on on fewer hosts. What run.json records of it (`size_changes`, and
`size`, which `mgpu status` shows), the notice that says it, the word it sends (`--notify`), and
the words of the closing line. The supervisor hands in the plans, the hosts' actions, the record
and the notifier."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping, Sequence

from launcher.plan.coordinator import JOB_ROLES
from launcher.plan.planner import TaskPlan
from launcher.protocol import ENV_HOSTS_MAX
from launcher.supervise import resize
from launcher.supervise.hosts import HostActions, Placement
from launcher.supervise.notify import Notifier
from launcher.supervise.runrecord import RunRecord, utc
from launcher.supervise.status import duration


def hosts_of(plans: Sequence[TaskPlan]) -> tuple[str, ...]:
    """The hosts of the job's members (chief and workers), as MGPU_HOSTS_MAX counts them; of every
    task for a run without members."""
    members = [plan for plan in plans if plan.type in JOB_ROLES] or plans
    return tuple(dict.fromkeys(plan.host for plan in members))


def planned_hosts(plans: Sequence[TaskPlan]) -> int:
    """The hosts the run was planned on: what its tasks are told (MGPU_HOSTS_MAX), also when a slow
    host was left out before the start."""
    told = plans[0].env.get(ENV_HOSTS_MAX, "") if plans else ""
    return int(told) if told.isdigit() else len(hosts_of(plans))


def renamed(before: Sequence[TaskPlan], after: Sequence[TaskPlan]) -> list[tuple[str, str]]:
    """(old name, new name) of each task left whose name changed: a host's tasks, in order, are the
    same tasks (each keeps its host, port and place among them), renumbered by the planner."""
    old: dict[str, list[str]] = {}
    for plan in before:
        old.setdefault(plan.host, []).append(plan.name)
    new: dict[str, list[str]] = {}
    for plan in after:
        new.setdefault(plan.host, []).append(plan.name)
    return [(was, now) for host, names in new.items() for was, now in zip(old.get(host, ()), names) if was != now]


@dataclasses.dataclass(frozen=True)
class SizeChange:
    """The run went on without `dropped`: from `hosts_from` hosts to `hosts_to`, of `planned`."""

    at: float  # seconds since the epoch
    dropped: tuple[str, ...]
    why: str
    hosts_from: int
    hosts_to: int
    tasks_from: int
    tasks_to: int
    planned: int  # hosts as the run was planned
    renamed: tuple[tuple[str, str], ...] = ()
    back: tuple[str, ...] = ()  # hosts taken back (a growth; `dropped` is then empty)

    @classmethod
    def of(cls, at: float, dropped: Sequence[str], why: str, before: Sequence[TaskPlan], after: Sequence[TaskPlan],
           planned: int, back: Sequence[str] = ()) -> "SizeChange":
        return cls(at, tuple(dropped), why, len(hosts_of(before)), len(hosts_of(after)), len(before), len(after),
                   planned, tuple(renamed(before, after)), tuple(back))

    def to_dict(self) -> dict:
        return {"at": utc(self.at), "dropped": list(self.dropped), "back": list(self.back), "why": self.why,
                "hosts": {"from": self.hosts_from, "to": self.hosts_to, "planned": self.planned},
                "tasks": {"from": self.tasks_from, "to": self.tasks_to},
                "renamed": {was: now for was, now in self.renamed}}

    def notice(self, min_hosts: int) -> str:
        """What the console says once the plans are made again."""
        left_out = ", ".join(self.dropped)
        renames = "; ".join(f"{was} is {now} now" for was, now in self.renamed[:4])
        more = f" (and {len(self.renamed) - 4} more)" if len(self.renamed) > 4 else ""
        return (f"no spare host for {left_out}: the run goes on on {self.hosts_to} of {self.planned} hosts "
                f"(--min-hosts {min_hosts}), {self.tasks_to} tasks in place of {self.tasks_from}"
                + (f"; {renames}{more}" if renames else ""))

    def back_notice(self) -> str:
        """What the console says once the plans are made again with hosts back."""
        return (f"{', '.join(self.back)} back: the run goes on on {self.hosts_to} of {self.planned} hosts, "
                f"{self.tasks_to} tasks in place of {self.tasks_from}")

    def story(self, until: float) -> str:
        """For the closing line: "ran on 2 of 3 hosts for 41 min"."""
        return f"ran on {self.hosts_to} of {self.planned} hosts for {duration(max(0.0, until - self.at))}"


def size_record(change: SizeChange) -> dict:
    """run.json's `size`: the hosts and tasks the run runs on now, since when."""
    return {"hosts": change.hosts_to, "planned_hosts": change.planned, "tasks": change.tasks_to,
            "since": utc(change.at)}


def place(hosts: HostActions, left_out: Sequence[str], dropped: Sequence[str], notice: Callable[[str], None],
          before: Sequence[TaskPlan] = (), min_hosts: int = 0) -> Placement:
    """The plans once `left_out` are left out: first without `dropped` (the hosts with no spare:
    the plans made again for the hosts left), then with a spare for each of the others. When the
    spares fall short (one failed its checks, or found a peer gone), those left with no spare are
    dropped too while `min_hosts` remain (resize.py's rule, on the spares left); Placement without
    plans when it cannot be done. `before`: the attempt's plans."""
    dropped, current, gone = tuple(dropped), list(before), ()
    placement = hosts.shrink(dropped, notice) if dropped else Placement(current)
    on_spares = [host for host in left_out if host not in dropped]
    # Each round but the last drops at least one host more: bounded by their number.
    for _ in range(len(left_out) + 1):
        if placement.plans is None or not on_spares:
            break
        current = list(placement.plans)
        placement = hosts.replace(on_spares, notice)
        gone += tuple(host for host in placement.gone if host not in gone)
        if placement.plans is not None or not min_hosts:
            break
        unplaced = on_spares + [host for host in placement.gone if host not in on_spares]
        fallback = resize.place(unplaced, hosts.view(current), min_hosts)
        if not fallback.goes_on or not fallback.dropped:
            break
        notice(f"no spare host left for {', '.join(fallback.dropped)} after a spare failed its checks: "
               f"the run goes on without {'them' if len(fallback.dropped) > 1 else 'it'} (--min-hosts {min_hosts})")
        placement = hosts.shrink(fallback.dropped, notice)
        dropped += fallback.dropped
        on_spares = [host for host in unplaced if host not in fallback.dropped]
    if placement.plans is None:
        return Placement(None, gone=gone)
    return dataclasses.replace(placement, gone=gone, dropped=dropped)


def resized(before: Sequence[TaskPlan], after: Sequence[TaskPlan], dropped: Sequence[str], why: Mapping[str, str],
            planned: int, min_hosts: int, record: RunRecord, notice: Callable[[str], None],
            notifier: Notifier) -> SizeChange | None:
    """Once the plans were made again without `dropped`: each said on the console and in a notice,
    the change recorded (run.json), told and returned; None when no host was dropped."""
    if not dropped:
        return None
    change = SizeChange.of(time.time(), dropped, "; ".join(f"{host}: {why.get(host, 'failed')}" for host in dropped),
                           before, after, planned)
    for host in dropped:
        notice(f"{host} left out for the rest of the run ({why.get(host, 'failed')})")
        notifier.host_left_out(host, why.get(host, "failed"), None, goes_on=True)
    notice(change.notice(min_hosts))
    record.size_changed(change.to_dict(), size_record(change))
    notifier.size_changed(change)
    return change


def grow(hosts: HostActions, back: Sequence[str], before: Sequence[TaskPlan], planned: int, record: RunRecord,
         notice: Callable[[str], None], notifier: Notifier) -> tuple[Sequence[TaskPlan] | None, SizeChange | None]:
    """The plans with the tasks of `back` (hosts that passed their probe) taken back and made ready,
    the change said, recorded and told; (None, None) when they cannot be (they stay out)."""
    placement = hosts.grow(back, notice)
    if placement.plans is None:
        notice(f"{', '.join(back)} could not be taken back (see above); the run goes on without")
        return None, None
    change = SizeChange.of(time.time(), (), "taken back", before, placement.plans, planned, back=back)
    notice(change.back_notice())
    record.size_changed(change.to_dict(), size_record(change))
    for host in back:
        notifier.host_taken_back(host)
    notifier.size_changed(change)
    return placement.plans, change
