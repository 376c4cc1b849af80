"""Preflight reachability: can every task open a TCP connection to every other task's TF_CONFIG address?

On every host of the cluster at the same time (so that the listeners exist while the
connections are made), the probe's reachability test (host/probe/reach_test.py) listens on that host's task ports
and connects to every cluster address (in a large cluster, to every pair of hosts and every
port: FULL_TEST_TASKS). One line per broken pair, e.g.
`worker:0 on h1 cannot connect to worker:1 at h2:2222: timed out after 5 s (10.0.0.5)`.
Local hosts are probed with a subprocess, remote ones through the SSH backend; the whole
test is bounded by the connect timeout plus the listeners' lingering and the SSH start-up. On a host
that the host check probes too, the same probe runs both, in one session (check.py).

The same probe lists each host's addresses by interface and the address it dialed for each
task: the interface of a host that holds the address the *other* hosts dialed for it is the one
NCCL and Gloo must use there (see plan/network.py). The others' view counts, not the host's own:
on Debian a host resolves its own name to 127.0.1.1.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Mapping, Sequence

from launcher.config.addresses import format_address
from launcher.errors import CheckFailed, MgpuError, UnreadableAnswer
from launcher.host.interfaces import interface_holding
from launcher.host.probe.reach_test import ALL_DIALED, DIALED, REACH_LINGER, REACH_WAIT
from launcher.plan.planner import TaskPlan
from launcher.preflight.answers import reach_answer, unreadable
from launcher.preflight.on_host import Conversation, HostShell, by_host, in_parallel
from launcher.preflight.probes import reach_args, reach_test_command

REACH_TIMEOUT = 5.0  # seconds each connection gets
# The probe (refused targets tried for REACH_WAIT x REACH_TIMEOUT, the last attempt up to
# REACH_TIMEOUT, the listeners' lingering), plus a slow SSH session start.
_RUN_TIMEOUT = (REACH_WAIT + 1) * REACH_TIMEOUT + REACH_LINGER + 30.0
HINT = (
    "hint: the tasks dial each other at their TF_CONFIG addresses: open those ports in the firewall "
    "between the hosts, and make every host resolve those names (an ssh-config alias is written as "
    "its HostName unless --keep-host-names; others need DNS or /etc/hosts), or give `address:` per host in a spec"
)


@dataclasses.dataclass(frozen=True)
class _Host:
    plans: tuple[TaskPlan, ...]  # its cluster tasks

    @property
    def first(self) -> TaskPlan:
        return self.plans[0]

    @property
    def names(self) -> str:
        return ",".join(p.name for p in self.plans)

    @property
    def ports(self) -> list[int]:
        return [p.port for p in self.plans if p.port is not None]


def _target(plan: TaskPlan) -> str:
    return format_address(plan.address, plan.port)


def _hosts(plans: Sequence[TaskPlan]) -> list[_Host]:
    # The evaluator is not in the cluster: no port, dials no one.
    return [_Host(tuple(group)) for group in by_host(plan for plan in plans if plan.port is not None)]


@dataclasses.dataclass(frozen=True)
class Reachability:
    problems: tuple[str, ...]  # one line per pair that cannot connect; () when every pair can
    # Per task: the interface that holds the address the other tasks dial (None where no
    # interface of its host holds it, e.g. a NAT address, or where the probe could not run).
    interfaces: Mapping[str, str | None]
    # Each pair of hosts where the first could not connect to a task of the second, in order found.
    cut: tuple[tuple[str, str], ...] = ()
    unreached: tuple[str, ...] = ()  # the hosts the test could not log in to (it did not run then)


# Up to this many cluster tasks, every host dials every task. Beyond, each host dials every task of
# its own and of the next host (in plan order, round), and the first task of every other host: every
# pair of hosts is still tried, and every port from another host, with hosts + 2 x tasks-per-host
# connections per host instead of every task (64 hosts of 8 tasks: 78, not 512).
FULL_TEST_TASKS = 64


def _dials(hosts: Sequence[_Host]) -> tuple[tuple[str, ...], ...]:
    """Per host, the targets it dials, in cluster order (see FULL_TEST_TASKS)."""
    every = tuple(_target(plan) for host in hosts for plan in host.plans)
    if len(every) <= FULL_TEST_TASKS:
        return (every,) * len(hosts)
    dials = []
    for i, host in enumerate(hosts):
        neighbour = hosts[(i + 1) % len(hosts)]
        chosen = {_target(plan) for plan in (*host.plans, *neighbour.plans)}
        chosen.update(_target(other.first) for other in hosts)
        dials.append(tuple(target for target in every if target in chosen))
    return tuple(dials)


class AllDialed:
    """Ends the listening of every host's test together (reach_test.py's DIALED and ALL_DIALED):
    each host's probe says when its own dials are done, and once every host has said it, or its
    probe has ended or never started, each is told that no dial is still to come."""

    def __init__(self, hosts: int):
        self._waiting = set(range(hosts))
        self._lock = threading.Lock()
        self._conversations = [Conversation(lambda line, i=i: self._heard(i, line)) for i in range(hosts)]

    def conversation(self, i: int) -> Conversation:
        """Host i's probe's."""
        return self._conversations[i]

    def ended(self, i: int) -> None:
        """Host i's probe has ended, or will never run: it dials no more."""
        self._done(i)

    def _heard(self, i: int, line: bytes) -> None:
        if line.strip() == DIALED.encode():
            self._done(i)

    def _done(self, i: int) -> None:
        with self._lock:
            if i not in self._waiting:
                return
            self._waiting.discard(i)
            if self._waiting:
                return
        for conversation in self._conversations:
            conversation.say(ALL_DIALED.encode() + b"\n")


@dataclasses.dataclass(frozen=True)
class ReachTest:
    """The reachability test of a set of plans: the hosts that take part (those with cluster
    tasks), the targets each dials, and how the hosts' answers are judged. The host check runs it
    in its own session on each host it checks (check.py); `probe_reachability` on its own."""

    hosts: tuple[_Host, ...]
    dials: tuple[tuple[str, ...], ...]  # per host, the targets it dials

    @classmethod
    def of(cls, plans: Sequence[TaskPlan]) -> "ReachTest":
        hosts = tuple(_hosts(plans))
        return cls(hosts, _dials(hosts))

    def index(self, plan: TaskPlan) -> int | None:
        """Which of the hosts `plan` runs on; None when it is not in the test."""
        for i, host in enumerate(self.hosts):
            if (host.first.host, host.first.local) == (plan.host, plan.local):
                return i
        return None

    def expected(self, i: int) -> list[int]:
        """Per port of host `i`, how many hosts dial it: its listener waits for that many."""
        return [sum(_target(plan) in dials for dials in self.dials)
                for plan in self.hosts[i].plans if plan.port is not None]

    def args(self, i: int) -> list[str]:
        """The probe's arguments for the test on host `i`."""
        return reach_args(self.hosts[i].ports, self.dials[i], REACH_TIMEOUT, self.expected(i))

    @property
    def run_timeout(self) -> float:
        """Seconds the test gets on a host, once it is reached."""
        return _RUN_TIMEOUT

    def all_dialed(self) -> AllDialed:
        """What ends the listening of the hosts' tests together (one for each run of the test)."""
        return AllDialed(len(self.hosts))

    def run(self, i: int, shell: HostShell, speed: Sequence[str] = (), speed_timeout: float = 0.0,
            all_dialed: AllDialed | None = None) -> dict:
        """The test alone on host `i` (and with `speed`, speed_args, the speed probe after it, under
        the key speed): its JSON answer; raises MgpuError when it could not run."""
        host = self.hosts[i]
        command = reach_test_command(host.first, host.ports, self.dials[i], REACH_TIMEOUT, self.expected(i), speed)
        try:
            answer = shell.json(host.first, command, self.run_timeout + speed_timeout, "reachability probe",
                                all_dialed.conversation(i) if all_dialed is not None else None)
            try:
                return reach_answer(answer)
            except UnreadableAnswer as e:
                raise unreadable(host.first.host, "reachability probe", str(e)) from None
        finally:
            if all_dialed is not None:
                all_dialed.ended(i)

    def judge(self, results: Sequence[dict]) -> Reachability:
        """The pairs that cannot connect, and each task's interface, from every host's answer (in
        the order of `hosts`)."""
        owner = {_target(plan): plan for host in self.hosts for plan in host.plans}
        problems = []
        cut = []
        interfaces = {}
        for host, result in zip(self.hosts, results):
            for port, reason in sorted(result.get("listen_errors", {}).items()):
                if "in use" in reason:
                    continue  # a busy port is reported by the host check and the supervisor, in their words
                problems.append(f"{host.names} on {host.first.host} cannot listen on port {port}: {reason}")
            for target, outcome in result.get("reach", {}).items():
                if outcome == "ok":
                    continue
                peer = owner.get(target)
                if peer is None:  # not a target it was given: nothing to say about it
                    continue
                if outcome.startswith("cannot resolve "):
                    problems.append(f"{host.names} on {host.first.host} {outcome} ({peer.name} at {target})")
                else:
                    problems.append(f"{host.names} on {host.first.host} cannot connect to {peer.name} at {target}: {outcome}")
                cut.append((host.first.host, peer.host))
        for i, (host, result) in enumerate(zip(self.hosts, results)):
            others = [view for j, view in enumerate(results) if j != i] or [result]  # a lone host: its own view
            for plan in host.plans:
                interfaces[plan.name] = _interface(_target(plan), others, result)
        return Reachability(tuple(problems), interfaces, tuple(dict.fromkeys(cut)))


def probe_reachability(plans: Sequence[TaskPlan], ssh_backend=None) -> Reachability:
    """Every host at once: which task pairs cannot connect (or ports cannot be listened on), and
    the interface each task is reached through."""
    test = ReachTest.of(plans)
    if not test.hosts:
        return Reachability((), {})
    shell = HostShell(ssh_backend)
    all_dialed = test.all_dialed()
    jobs = [lambda i=i: test.run(i, shell, all_dialed=all_dialed) for i in range(len(test.hosts))]
    try:  # every host at once: its listeners must be up while the others connect
        results = in_parallel(jobs, len(jobs))
    except MgpuError as e:
        return Reachability((str(e),), {})
    return test.judge(results)


def _interface(target: str, views: Sequence[dict], own: dict) -> str | None:
    """The interface of a host (whose probe answered `own`) that holds the address the other hosts'
    probes (`views`) dialed for `target`, one of its tasks."""
    try:
        dialed = [view.get("dialed", {}).get(target) for view in views]
        return interface_holding([ip for ip in dialed if isinstance(ip, str)],
                                 [(str(address), str(name)) for address, name in own.get("addresses") or []])
    except (AttributeError, TypeError, ValueError):  # an answer of the wrong shape: no interface is set
        return None


def describe_interfaces(plans: Sequence[TaskPlan], interfaces: Mapping[str, str | None]) -> str:
    """One line: the interface NCCL and Gloo are given on each host, e.g.
    `NCCL and Gloo use eth1 on h1, eth1 on h2`, and the hosts where no interface holds the
    address the others dial (NAT, a name that resolves elsewhere), where they choose their own."""
    per_host: dict[str, str | None] = {}
    for plan in plans:
        if plan.name in interfaces:
            per_host.setdefault(plan.host, interfaces[plan.name])
    found = [f"{name} on {host}" for host, name in per_host.items() if name]
    unknown = [host for host, name in per_host.items() if not name]
    parts = []
    if found:
        parts.append("NCCL and Gloo use " + ", ".join(found))
    if unknown:
        parts.append("no interface holds the address of " + ", ".join(unknown) + ": NCCL and Gloo choose there")
    return "; ".join(parts) or "NCCL and Gloo choose their interfaces (no task is in the cluster)"


def check_reachability(plans: Sequence[TaskPlan], ssh_backend=None) -> Mapping[str, str | None]:
    """Raise CheckFailed listing every broken pair, with a hint, when a task cannot reach another;
    else return each task's interface (see Reachability.interfaces)."""
    return reachable_interfaces(probe_reachability(plans, ssh_backend))


def reachable_interfaces(found: Reachability) -> Mapping[str, str | None]:
    """Each task's interface, when the test found no broken pair; else CheckFailed listing them all."""
    if found.problems:
        raise CheckFailed("tasks cannot reach each other:\n" + "\n".join(found.problems) + "\n" + HINT)
    return found.interfaces
