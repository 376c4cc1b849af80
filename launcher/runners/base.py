"""The runner interface the supervisor drives.

A runner starts one task from its plan and hands back a TaskProcess: two byte
streams to read lines from, an exit status to poll, and a way to signal the
task's whole process tree. The supervisor owns everything else (output, timing,
fail-fast, restarts), so a backend stays small and knows nothing of TensorFlow.
"""

from __future__ import annotations

import abc
from typing import BinaryIO

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
        task listens on own_port, or holds an established TCP connection to coordinator_port.
        None when this runner cannot tell."""
        return None

    def close(self) -> None:
        """Release pipes or channels. Called once the task has ended."""


class Runner(abc.ABC):
    """Starts tasks of one kind (local or SSH)."""

    @abc.abstractmethod
    def start(self, task: TaskPlan, attempt: int) -> TaskProcess:
        """Start a task: its argv in its workdir, with its env added to the base env.

        `attempt` is 0 for the first start and counts restarts; it is passed to
        the task as MGPU_ATTEMPT. Raises MgpuError when the task cannot start.
        """

    def close(self) -> None:
        """Release connections. Called once, after every task has ended."""
