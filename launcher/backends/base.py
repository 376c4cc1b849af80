"""The backend interface the supervisor drives.

A backend is one way of running tasks (local processes, SSH, a Slurm step) and owns their
processes, as torchrun's PContext does for a group: it starts an attempt's tasks together
(Backend.begin_attempt), hands back a TaskProcess per task (two byte streams to read lines
from, an exit status to poll, a way to signal the task's whole process tree), and answers for
what else concerns those processes: whether their ports are free before a run, the processes
of a run that left their task's tree (strays), and a last sweep for anything of the run still alive. The supervisor owns everything else
(output, timing, fail-fast, restarts, the record), so a backend stays small and knows nothing
of TensorFlow. A run that mixes local and SSH tasks has one backend still: Routed, which hands
each task to the backend it runs on.
"""

from __future__ import annotations

import abc
import signal
from operator import methodcaller
from typing import BinaryIO, Callable, NamedTuple, Sequence

from launcher.host.beside_task import Ran
from launcher.host.py_spy import Answer
from launcher.plan.planner import TaskPlan

# Seconds a stopped task's processes get between SIGTERM and SIGKILL (`--grace-period`): on this
# machine, in a Slurm step, and on a remote host when the task's SSH session ends.
DEFAULT_GRACE_PERIOD = 10.0


class CpuUsage(NamedTuple):
    """A task's processes' use of the CPU so far, summed over their threads, as one sampler saw it."""
    at: float  # seconds on the sampler's own clock (a remote host's uptime over SSH)
    cpu_seconds: float  # on a CPU
    runnable_seconds: float  # on a CPU or waiting for one (a runqueue, a CPU quota's throttling)


class TaskProcess(abc.ABC):
    """A started task.

    `stdout` and `stderr` are binary streams whose `read1()` returns what has arrived (a
    partial line too: progress bars redraw without a newline) and b"" at end of stream.
    The supervisor reads both concurrently from threads.
    """

    stdout: BinaryIO
    stderr: BinaryIO
    # The local pid, or the remote process group id for an SSH task.
    pid: int

    @abc.abstractmethod
    def poll(self) -> int | None:
        """None while running, else the exit code; -N means killed by signal N."""

    @abc.abstractmethod
    def signal_tree(self, signum: int) -> None:
        """Send a signal to every process of the task. A no-op once it is gone."""

    def listens_on(self, port: int) -> bool | None:
        """Whether a process of the task listens on `port`; None when this backend cannot tell.

        How the supervisor knows that a program which does not print the ready line has
        started its server (TensorFlow's gRPC server listens once the strategy is built).
        """
        return None

    def joined(self, own_port: int | None, coordinator_port: int | None) -> bool | None:
        """Whether the task has joined its cluster in a way any framework shows: a process of the
        task listens on `own_port` (TensorFlow's server, process 0 of JAX or PyTorch), or holds an
        established TCP connection to `coordinator_port` (the other JAX and PyTorch processes).
        None when this backend cannot tell."""
        return self.listens_on(own_port) if own_port is not None else None

    def dump_stacks(self) -> None:
        """SIGABRT to the task's processes, each once: Python's faulthandler (PYTHONFAULTHANDLER)
        writes every thread's stack to stderr, then the process ends. Once, because faulthandler's
        handler restores the default action first and leaves the signal unblocked: a second
        SIGABRT would end the process in the middle of its dump."""
        self.signal_tree(signal.SIGABRT)

    def spy_stacks(self, native: bool, task: TaskPlan, timeout: float) -> Answer | None:
        """py-spy's dump of each of the task's processes, read where the task runs, the task going on
        (host/py_spy.py); py-spy may be beside the task's interpreter (its argv[0]). None when this
        backend cannot run it there."""
        return None

    def run_beside(self, command: str, task: TaskPlan, timeout: float, limit: int) -> Ran:
        """The /bin/sh `command` where the task runs, in its folder, with its PATH
        (host/beside_task.py): its exit status and stdout cut to `limit` bytes, within `timeout`."""
        return Ran(None, problem="this backend cannot run a command beside its tasks")

    def cpu_seconds(self) -> float | None:
        """CPU time the task's live processes have used (user and system); None when this backend
        cannot tell. The stall watchdog counts CPU use as progress."""
        usage = self.usage()
        return None if usage is None else usage.cpu_seconds

    def usage(self) -> CpuUsage | None:
        """The latest sample of the task's CPU use (running and runnable time); None when this
        backend cannot tell (yet). What tells a task that computes from one that waits."""
        return None

    def stopped(self) -> bool | None:
        """Whether a process of the task is stopped (SIGSTOP, or held by a debugger): it runs no
        more until continued. None when this backend cannot tell (yet)."""
        return None

    def lost(self) -> str | None:
        """Why the task's host stopped answering while it ran (its connection was lost, the task
        vanished without an exit status), in a few words; None when it was not lost."""
        return None

    def answers(self) -> bool | None:
        """Whether the task's host answers now, within a bound of the backend's own; one that does
        not is judged lost (`lost` then says why). None where there is no connection to ask."""
        return None

    def out_of_memory(self) -> tuple[str, bool] | None:
        """Once the task has ended: its memory cgroup, and whether the kernel's OOM killer ended a
        process there since the task started. None where the backend cannot see it (another host)."""
        return None

    def close(self) -> None:
        """Release pipes or channels. Called once the task has ended."""


class Strays:
    """Processes of a run that left their task's process tree (a daemonised helper, a
    double fork): signalled with the tasks when the run stops. None by default."""

    def signal(self, signum: int) -> None:
        """Send `signum` to each one still alive."""

    def alive(self) -> bool:
        """Whether any is still alive."""
        return False


class Attempt(abc.ABC):
    """The tasks of one attempt on one backend, from begin_attempt() to end()."""

    @abc.abstractmethod
    def start(self, task: TaskPlan) -> TaskProcess:
        """Start a task of the attempt (or, where the backend started them together, hand out
        its view): its argv in its workdir, with its env added to the base env and MGPU_ATTEMPT
        set to the attempt's number. Raises MgpuError when the task cannot start."""

    def starts_together(self, task: TaskPlan) -> bool:
        """Whether start(task) may run at the same time as other starts, from another thread."""
        return False

    def end(self) -> None:
        """After every task of the attempt has ended and been closed."""


class Backend(abc.ABC):
    """Starts tasks of one kind (local, SSH or Slurm) and answers for their processes."""

    @abc.abstractmethod
    def begin_attempt(self, tasks: Sequence[TaskPlan], attempt: int) -> Attempt:
        """The attempt's tasks (this backend's), before they are started one by one; a backend
        that starts them together (Slurm: one srun step) does it here. `attempt` is 0 for the
        first start and counts restarts."""

    def check_ports(self, tasks: Sequence[TaskPlan]) -> None:
        """Raise TaskFailed when a port planned for one of `tasks` (this backend's) is already
        taken. A backend that cannot tell before starting does nothing (its tasks say so)."""

    def strays(self, run_id: str, launch_id: str | None = None) -> Strays:
        """The run's processes outside its tasks' trees, found now (of the launch `launch_id`
        only, if given: protocol.ENV_LAUNCH_ID)."""
        return Strays()

    def sweep(self, run_id: str, grace: float, launch_id: str | None = None) -> int:
        """Stop whatever of the run (of the launch `launch_id`, if given) is still alive after its
        tasks were stopped; how many were found."""
        return 0

    def writes_here(self, task: TaskPlan) -> bool:
        """Whether the task runs on this machine, where it can write into the run dir."""
        return False

    def close(self) -> None:
        """Release connections. Called once, after every task has ended."""


class TaskByTask(Attempt):
    """An attempt whose tasks a backend starts one by one with its start(task, attempt)."""

    def __init__(self, start: Callable[[TaskPlan, int], TaskProcess], attempt: int, together: bool = False):
        self._start = start
        self._attempt = attempt
        self._together = together  # start() may run from several threads at once

    def start(self, task: TaskPlan) -> TaskProcess:
        return self._start(task, self._attempt)

    def starts_together(self, task: TaskPlan) -> bool:
        return self._together


class Routed(Backend):
    """One backend for a run that mixes kinds of tasks: each task goes to the backend `route`
    names for it, and each run-wide duty (ports, strays, sweep) to every backend."""

    def __init__(self, backends: Sequence[Backend], route: Callable[[TaskPlan], Backend]):
        self.backends = list(dict.fromkeys(backends))  # each once, in order
        self._route = route

    def backend_for(self, task: TaskPlan) -> Backend:
        return self._route(task)

    def _by_backend(self, tasks: Sequence[TaskPlan]) -> dict[Backend, list[TaskPlan]]:
        groups: dict[Backend, list[TaskPlan]] = {}
        for task in tasks:
            groups.setdefault(self._route(task), []).append(task)
        return groups

    def begin_attempt(self, tasks: Sequence[TaskPlan], attempt: int) -> Attempt:
        return _RoutedAttempt(self, self._by_backend(tasks), attempt)

    def check_ports(self, tasks: Sequence[TaskPlan]) -> None:
        for backend, own in self._by_backend(tasks).items():
            backend.check_ports(own)

    def strays(self, run_id: str, launch_id: str | None = None) -> Strays:
        return _AllStrays([backend.strays(run_id, launch_id) for backend in self.backends])

    def sweep(self, run_id: str, grace: float, launch_id: str | None = None) -> int:
        return sum(backend.sweep(run_id, grace, launch_id) for backend in self.backends)

    def writes_here(self, task: TaskPlan) -> bool:
        return self._route(task).writes_here(task)

    def close(self) -> None:
        _each(self.backends, methodcaller("close"))


class _RoutedAttempt(Attempt):
    def __init__(self, routed: Routed, groups: dict[Backend, list[TaskPlan]], attempt: int):
        self._routed = routed
        self._attempts: dict[Backend, Attempt] = {}
        try:
            for backend, tasks in groups.items():
                self._attempts[backend] = backend.begin_attempt(tasks, attempt)
        except BaseException:
            self.end()
            raise

    def start(self, task: TaskPlan) -> TaskProcess:
        return self._attempts[self._routed.backend_for(task)].start(task)

    def starts_together(self, task: TaskPlan) -> bool:
        return self._attempts[self._routed.backend_for(task)].starts_together(task)

    def end(self) -> None:
        attempts = list(self._attempts.values())
        self._attempts.clear()
        _each(attempts, methodcaller("end"))


def _each(items: Sequence, action: Callable) -> None:
    """`action` on each item, also when it raises for an earlier one (the first error is raised)."""
    if items:
        try:
            action(items[0])
        finally:
            _each(items[1:], action)


class _AllStrays(Strays):
    def __init__(self, strays: list[Strays]):
        self._strays = strays

    def signal(self, signum: int) -> None:
        for strays in self._strays:
            strays.signal(signum)

    def alive(self) -> bool:
        return any(strays.alive() for strays in self._strays)
