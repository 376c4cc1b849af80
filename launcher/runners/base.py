"""The runner interface the supervisor drives.

A runner starts one task from its plan and hands back a TaskProcess: two byte
streams to read lines from, an exit status to poll, and a way to signal the
task's whole process tree. A runner also owns what else concerns the processes
it starts: whether their ports are free before a run, the processes of a run
that left their task's tree (strays), and a last sweep for anything of the run
still alive. The supervisor owns everything else (output, timing, fail-fast,
restarts, the record), so a backend stays small and knows nothing of TensorFlow.
"""

from __future__ import annotations

import abc
import signal
from typing import BinaryIO, Sequence

from launcher.plan.planner import TaskPlan


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
        """Whether a process of the task listens on `port`; None when this runner cannot tell.

        How the supervisor knows that a program which does not print the ready line has
        started its server (TensorFlow's gRPC server listens once the strategy is built).
        """
        return None

    def joined(self, own_port: int | None, coordinator_port: int | None) -> bool | None:
        """Whether the task has joined its cluster in a way any framework shows: a process of the
        task listens on `own_port` (TensorFlow's server, process 0 of JAX or PyTorch), or holds an
        established TCP connection to `coordinator_port` (the other JAX and PyTorch processes).
        None when this runner cannot tell."""
        return self.listens_on(own_port) if own_port is not None else None

    def dump_stacks(self) -> None:
        """SIGABRT to the task's processes, each once: Python's faulthandler (PYTHONFAULTHANDLER)
        writes every thread's stack to stderr, then the process ends. Once, because faulthandler's
        handler restores the default action first and leaves the signal unblocked: a second
        SIGABRT would end the process in the middle of its dump."""
        self.signal_tree(signal.SIGABRT)

    def cpu_seconds(self) -> float | None:
        """CPU time the task's live processes have used (user and system); None when this runner
        cannot tell. The stall watchdog counts CPU use as progress."""
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


class Runner(abc.ABC):
    """Starts tasks of one kind (local, SSH or Slurm) and answers for their processes."""

    def begin_attempt(self, tasks: Sequence[TaskPlan], attempt: int) -> None:
        """Before an attempt's tasks are started one by one: a runner that starts them together
        (Slurm: one srun step) does it here."""

    def end_attempt(self) -> None:
        """After every task of the attempt has ended and been closed."""

    def check_ports(self, tasks: Sequence[TaskPlan]) -> None:
        """Raise TaskFailed when a port planned for one of `tasks` (this runner's) is already
        taken. A runner that cannot tell before starting does nothing (its tasks say so)."""

    def strays(self, run_id: str) -> Strays:
        """The run's processes outside its tasks' trees, found now."""
        return Strays()

    def sweep(self, run_id: str, grace: float) -> int:
        """Stop whatever of the run is still alive after its tasks were stopped; how many were found."""
        return 0

    @abc.abstractmethod
    def start(self, task: TaskPlan, attempt: int) -> TaskProcess:
        """Start a task: its argv in its workdir, with its env added to the base env.

        `attempt` is 0 for the first start and counts restarts; it is passed to
        the task as MGPU_ATTEMPT. Raises MgpuError when the task cannot start.
        """

    def close(self) -> None:
        """Release connections. Called once, after every task has ended."""
