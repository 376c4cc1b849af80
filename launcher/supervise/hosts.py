"""The run's hosts between attempts, as the supervisor sees them: the policy's view of them (FleetView),
what the supervisor may ask of them (HostActions, which the launch's Fleet answers), every host of a
failed attempt judged at once, and the words for hosts left out.

The supervisor charges one task and its host with an attempt's failure (causes.py); hosts lost
together are judged together: every other host whose connection was lost, or whose tasks gave no
exit status even after the stop, gets a fresh login, all at once, and is judged as the charged host
is. The policy leaves out every host judged lost in one step, so that no spare is checked beside a
peer that is gone.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Callable, Sequence

from launcher.plan.planner import TaskPlan
from launcher.supervise import causes

# Fresh logins at once when judging hosts: each waits at most its own connect timeout.
MAX_LOGINS_AT_ONCE = 32


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the tasks of the hosts left out went."""

    plans: Sequence[TaskPlan] | None  # with spares in their place; None: a host had no spare left
    took: tuple[tuple[str, str], ...] = ()  # (host left out, the spare that took its tasks)
    gone: tuple[str, ...] = ()  # peers the spares' checks found gone: left out too, never the spares' fault
    dropped: tuple[str, ...] = ()  # hosts left out with no spare: the run goes on without them (--min-hosts)


@dataclasses.dataclass(frozen=True)
class FleetView:
    """The run's hosts as the policy sees them between attempts: data, no actions."""

    in_use: tuple[str, ...] = ()  # the hosts of the attempt's tasks, in plan order
    this_machine: frozenset[str] = frozenset()  # those of them that are this machine (the launcher runs there)
    spares: tuple[str, ...] = ()  # the spares left, in the order they are taken

    @classmethod
    def of(cls, plans: Sequence[TaskPlan], spares: Sequence[str] = ()) -> FleetView:
        return cls(tuple(dict.fromkeys(plan.host for plan in plans)),
                   frozenset(plan.host for plan in plans if plan.local), tuple(spares))

    def may_leave_out(self, host: str) -> bool:
        """A host of the run that is not this machine: the launcher runs here, so this machine stays."""
        return host in self.in_use and host not in self.this_machine


class HostActions:
    """What the supervisor may ask of a run's hosts between attempts, and the only way it knows
    them. These answers are those of a run whose hosts cannot change (no spare, no fresh login);
    a launch's Fleet (launcher/fleet/) answers for its hosts."""

    question = causes.FRESH_LOGIN  # how login_ok asks, in the words of the causes it gives

    def view(self, plans: Sequence[TaskPlan]) -> FleetView:
        """The hosts that run `plans` (the attempt's) and the spares left, for the policy."""
        return FleetView.of(plans)

    def login_ok(self, plan: TaskPlan) -> bool | None:
        """Whether the host of a task answers a fresh login now; None: cannot tell (this machine)."""
        return None

    def replace(self, hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """The plans with spares (that passed the checks) in place of `hosts`, each host its own;
        `notice` takes what is said meanwhile (a spare failing its checks, a peer found gone)."""
        return Placement(None)

    def shrink(self, hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """The plans made again without `hosts`, on the hosts left (--min-hosts); None: cannot."""
        return Placement(None)

    def probe_back(self, host: str) -> bool:
        """Whether a host the run went on without answers and passes the host check again."""
        return False

    def grow(self, hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """The plans with the tasks of `hosts` (back after a probe) taken back; None: cannot."""
        return Placement(None)

    def unreachable(self, plans: Sequence[TaskPlan]) -> tuple[str, str] | None:
        """The reachability test run again on the plans' hosts: the first pair of hosts where the
        first cannot connect to a task of the second; None when every pair connects (or it cannot tell)."""
        return None

    def relaunch(self, hosts: Sequence[str]) -> str | None:
        """The command that relaunches the run without `hosts`; None when it cannot be written."""
        return None

    def unhealthy(self, plans: Sequence[TaskPlan], left_out: Sequence[str]) -> dict[str, str]:
        """The hosts of `plans` but `left_out` that fail the health check now, each with why."""
        return {}

    def remember_left_out(self, why: dict[str, str], notice: Callable[[str], None]) -> None:
        """Hosts left out for a fault of their own ('cause: detail' each), for later runs to avoid;
        `notice` takes what is said of it."""


@dataclasses.dataclass(frozen=True)
class Seen:
    """One task of a failed attempt, as it was once the attempt had stopped."""

    plan: TaskPlan
    lost: str | None  # why its host's connection was lost; None: not lost
    ended: bool  # whether it gave an exit status


def judge_others(status: str, seen: Sequence[Seen], charged: str | None, hosts: HostActions) -> list[causes.Cause]:
    """The causes of the attempt's hosts other than `charged` (and this machine) whose connection
    was lost or whose tasks gave no exit status: each answers a fresh login, all at once. A host
    whose tasks only gave no exit status but that answers the login is not judged further."""
    suspects: dict[str, Seen] = {}
    for task in seen:
        if task.plan.local or task.plan.host == charged or (task.lost is None and task.ended):
            continue
        if task.plan.host not in suspects or task.lost is not None and suspects[task.plan.host].lost is None:
            suspects[task.plan.host] = task
    if not suspects:
        return []
    with concurrent.futures.ThreadPoolExecutor(min(len(suspects), MAX_LOGINS_AT_ONCE),
                                               thread_name_prefix="login") as pool:
        logins = list(pool.map(lambda task: hosts.login_ok(task.plan), suspects.values()))
    judged = []
    for task, login in zip(suspects.values(), logins):
        lost = task.lost
        if lost is None:
            if login is not False:
                continue
            lost = f"{task.plan.name} gave no exit status"
        cause = causes.classify(causes.Evidence(status, task.plan.name, task.plan.host, lost=lost, login_ok=login,
                                                asked=hosts.question))
        if cause is not None:
            judged.append(cause)
    return judged


def left_out_head(why: dict[str, str], moved: Sequence[str], relaunch: str | None, fewer: str = "") -> str:
    """The line a run stops with when hosts left out have no spare to take their tasks (`fewer`:
    and too few hosts would be left to go on without them, --min-hosts)."""
    hosts = "; ".join(f"{host} left out ({reason})" for host, reason in why.items())
    it = "it" if len(why) == 1 else "them"
    return (f"{hosts} and no spare host to take {', '.join(moved)}" + (f"; {fewer}" if fewer else "")
            + (f"; relaunch without {it}:\n  {relaunch}" if relaunch else ""))


def place_on_spares(hosts: Sequence[str], spares: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    """Each host left out, in order, with the next spare, in the spares' order: (host, spare) pairs.
    None when the spares run out first: the run cannot go on without a place for every task."""
    if len(spares) < len(hosts):
        return None
    return tuple(zip(hosts, spares))
