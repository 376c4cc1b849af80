"""Why an attempt failed: one cause per failed attempt, charged to a task and its host.

Pure: the supervisor gathers what it saw of the attempt (how it stopped, the task at fault by the
blame rules of diagnosis.py, that task's exit, its program error, whether its host's connection was
lost and whether the host answered a fresh login afterwards) into `Evidence`; `classify` names the
cause. The policy (policy.py) decides from the causes what to do next: restart, leave a host out,
or stop.

Also pure: whom a failed check of spare hosts charges (`check_fault`): a spare is never charged for
a peer that is gone.

The causes:
- program-error: the program failed by itself (an exception, an error it reported, an exit code);
- host-lost: the connection to the task's host (its SSH keepalives) was lost, or its tasks vanished
  without an exit status, and the host then failed a fresh login (in a Slurm allocation, where mgpu
  logs in to no node: Slurm's controller had the node down);
- network: the connection was lost but the host answers a fresh login, or the tasks could not
  reach each other;
- killed: SIGKILL that mgpu did not send (usually the kernel's out-of-memory killer);
- preempted: exit code 42 (protocol.EXIT_PREEMPTED) or SIGTERM from outside (exit_rules.py restates an
  exit code under the rule --exit-codes gives it);
- start-timeout, stalled: the supervisor's own deadlines. A stall is charged to a host whose
  connection is gone, or that fails a fresh login, as host-lost or network (the hosts' state is
  judged before the stall's cause is chosen: the stall clock may run out before the keepalives do),
  and else to a task seen stopped (state T: SIGSTOP, or t: a debugger), the one the others wait for.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Collection, Mapping, Sequence

from launcher import protocol
from launcher.exit_codes import ExitRule
from launcher.supervise import status

PROGRAM_ERROR = "program-error"
HOST_LOST = "host-lost"
NETWORK = "network"
KILLED = "killed"
PREEMPTED = "preempted"
START_TIMEOUT = "start-timeout"
STALLED = "stalled"
CAUSES = (PROGRAM_ERROR, HOST_LOST, NETWORK, KILLED, PREEMPTED, START_TIMEOUT, STALLED)

# Causes that say the host is at fault, not the program: its host is left out at once.
HOST_CAUSES = (HOST_LOST, NETWORK)


@dataclasses.dataclass(frozen=True)
class HostQuestion:
    """How the supervisor asks whether a host is still there after a loss, in a cause's words."""

    down: str  # the answer of a host that is not there
    up: str  # the answer of one that is


FRESH_LOGIN = HostQuestion("a fresh login fails", "the host answers a fresh login")
# In a Slurm allocation mgpu logs in to no node: the controller's state for the node stands in.
NODE_STATE = HostQuestion("Slurm's controller has the node down", "Slurm's controller has the node up")


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the supervisor saw of a failed attempt."""

    status: str  # the status (status.py) the attempt stopped with
    task: str | None = None  # the task at fault (diagnosis.blame), or the first missing / stalled one
    host: str | None = None  # that task's host
    returncode: int | None = None  # that task's exit (negative: a signal); None while it ran
    error: str | None = None  # its program error in one line ("ValueError: bad at train.py:3 in main")
    lost: str | None = None  # why its host's connection was lost ("SSH keepalives unanswered"); None: not lost
    login_ok: bool | None = None  # whether the host answered a fresh login after the loss; None: not tried
    asked: HostQuestion = FRESH_LOGIN  # how login_ok was asked
    unreachable: tuple[str, str] | None = None  # a pair of hosts the reachability probe found cut
    progress: int | None = None  # the highest step the attempt's tasks reported; None: none reported
    # For a task killed by SIGKILL: its memory cgroup, and whether the OOM killer acted there (None: unseen).
    out_of_memory: tuple[str, bool] | None = None
    stopped: bool = False  # that task was seen stopped (state T or t) while it ran


@dataclasses.dataclass(frozen=True)
class Cause:
    kind: str  # one of CAUSES
    task: str | None
    host: str | None
    detail: str  # one line for people: what happened
    error: str | None = None  # the program error, for telling whether two failures are the same
    returncode: int | None = None  # the task's exit code, where it ended with one by itself
    rule: ExitRule | None = None  # the exit-code rule it falls under (exit_rules.restate)

    def same_failure(self, other: Cause) -> bool:
        """The same cause and the same program error (or, for what is not the program's, the same host)."""
        if self.kind != other.kind:
            return False
        if self.kind == PROGRAM_ERROR:
            return self.error == other.error
        return self.host == other.host

    def to_dict(self) -> dict:
        said = {"cause": self.kind, "task": self.task, "host": self.host, "detail": self.detail}
        return {**said, "rule": self.rule.to_dict()} if self.rule is not None else said


def classify(evidence: Evidence) -> Cause | None:
    """The cause of a failed attempt; None for one that succeeded or was interrupted."""
    e = evidence
    if e.status in (status.SUCCEEDED, status.INTERRUPTED, status.RUNNING):
        return None
    if e.status == status.STALLED and e.lost is None and e.unreachable is None:
        if e.stopped:
            return Cause(STALLED, e.task, e.host, f"{e.task} was stopped (SIGSTOP, or a debugger): "
                                                  f"the other tasks waited for it")
        return Cause(STALLED, e.task, e.host, "no progress from any training task")
    if e.status == status.START_TIMEOUT:
        return Cause(START_TIMEOUT, e.task, e.host, f"{e.task} not ready in time" if e.task else "not ready in time")
    if e.unreachable is not None:
        a, b = e.unreachable
        return Cause(NETWORK, e.task, e.host, f"{a} cannot reach {b}")
    if e.lost is not None:
        if e.login_ok is False:
            return Cause(HOST_LOST, e.task, e.host, f"{e.lost}; {e.asked.down}")
        if e.login_ok is True:
            return Cause(NETWORK, e.task, e.host, f"{e.lost}, but {e.asked.up}")
        return Cause(HOST_LOST, e.task, e.host, e.lost)
    code = e.returncode
    if code == protocol.EXIT_PREEMPTED:
        return Cause(PREEMPTED, e.task, e.host, f"exited with code {code} (preempted)", returncode=code)
    if code == -signal.SIGTERM:
        return Cause(PREEMPTED, e.task, e.host, "SIGTERM from outside mgpu (preempted)")
    if code == -signal.SIGKILL:
        return Cause(KILLED, e.task, e.host, _killed(e.out_of_memory))
    exited = code if code is not None and code > 0 else None
    if e.error:
        return Cause(PROGRAM_ERROR, e.task, e.host, e.error, error=e.error, returncode=exited)
    what = describe(code)
    return Cause(PROGRAM_ERROR, e.task, e.host, what, error=what, returncode=exited)


@dataclasses.dataclass(frozen=True)
class TaskState:
    """A task of a stalled attempt, as the supervisor saw it before stopping it."""

    name: str
    host: str
    local: bool  # on this machine: no connection to lose, no login to try
    lost: str | None = None  # why its host's connection was lost; None: not lost
    stopped: bool = False  # seen stopped (state T or t) while it ran


SILENT = "its tasks went silent"  # a stalled task's host whose connection was not yet judged lost


def stall_evidence(tasks: Sequence[TaskState], logins: Mapping[str, bool | None],
                   progress: int | None = None, asked: HostQuestion = FRESH_LOGIN) -> Evidence:
    """What a stall is charged to, from the tasks in plan order and whether each remote host
    answered a fresh login after the stall (`logins`, by host; a host left out was not tried).
    The hosts first: a task whose host's connection was lost, then one whose host fails a fresh
    login (its connection is gone, though the keepalives have not said so yet); then a task seen
    stopped; else no task."""
    for task in tasks:
        if task.lost is not None and not task.local:
            return Evidence(status.STALLED, task.name, task.host, lost=task.lost, login_ok=logins.get(task.host),
                            asked=asked, progress=progress)
    for task in tasks:
        if not task.local and logins.get(task.host) is False:
            return Evidence(status.STALLED, task.name, task.host, lost=SILENT, login_ok=False, asked=asked,
                            progress=progress)
    for task in tasks:
        if task.stopped:
            return Evidence(status.STALLED, task.name, task.host, stopped=True, progress=progress)
    return Evidence(status.STALLED, progress=progress)


def _killed(out_of_memory: tuple[str, bool] | None) -> str:
    """A SIGKILL mgpu did not send, said as far as the evidence goes: the kernel's count of OOM
    kills in the task's memory cgroup, where this machine can read it."""
    if out_of_memory is None:
        return ("killed by SIGKILL that mgpu did not send (out of memory, or a kill from outside: "
                "no record of which here)")
    cgroup, oom = out_of_memory
    if oom:
        return f"killed by the kernel's OOM killer (memory cgroup {cgroup})"
    return f"killed by SIGKILL from outside mgpu; no out-of-memory kill in its memory cgroup ({cgroup})"


def describe(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering its peers"
    if returncode < 0:
        return f"killed by {status.signal_name(-returncode)}"
    return f"exited with code {returncode}"


def check_fault(hosts: Sequence[str], spares: Collection[str], unreached: Collection[str],
                cut: Collection[tuple[str, str]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Whom a failed check of `spares` charges, the reachability test having run on `hosts` (the
    spares among them): the spares at fault, and the peers found gone. `unreached`: the hosts the
    check could not log in to; `cut`: the pairs of hosts where the first could not connect to a task
    of the second.

    A host is gone when the check could not log in to it, or when no other host of the test could
    connect to it. A gone peer is the peer's fault, never the spare's: the spares are charged only
    when one of them is gone, or when a spare could not connect to a peer that the other hosts reach
    (then the spare's own network is the likely fault). ((), ()) when the check says neither: the
    caller charges the spares, as for any other failed check."""
    def gone(host: str) -> bool:
        others = [other for other in hosts if other != host]
        return host in unreached or bool(others) and all((other, host) in cut for other in others)

    peers_gone = tuple(host for host in hosts if host not in spares and gone(host))
    spares_at_fault = tuple(spare for spare in spares if gone(spare) or any(
        near == spare and far not in peers_gone for near, far in cut))
    return spares_at_fault, peers_gone
