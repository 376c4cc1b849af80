"""A process started on a pid chosen by the test: the kernel hands pids out again, and code that
keeps a process by its pid must tell the new program from the old one (needs root)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from typing import Iterator

import pytest

from needs import missing

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


@contextlib.contextmanager
def _next_pid_held() -> Iterator[None]:
    """The machine's pid counter, this test's alone to move (test processes side by side take turns),
    put back where it was after."""
    folder = "/run/lock" if os.path.isdir("/run/lock") else "/tmp"
    with open(os.path.join(folder, "mgpu-test-ns-last-pid.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        try:
            with open(NS_LAST_PID) as counter:
                before = int(counter.read())
        except OSError as e:
            missing(f"cannot read the next pid from {NS_LAST_PID}: {e}")
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # where it could not be moved, there is nothing to put back
                with open(NS_LAST_PID) as counter:
                    now = int(counter.read())
                with open(NS_LAST_PID, "w") as counter:
                    counter.write(str(max(before, now)))


def start_with_pid(pid: int, argv: list[str], **popen_args) -> subprocess.Popen:
    """`argv` started as process `pid` again. Another process of the machine may take the pid between
    the write and the fork: then it tries again, up to 1000 times."""
    with _next_pid_held():
        for _ in range(1000):
            try:
                with open(NS_LAST_PID, "w") as counter:
                    counter.write(str(pid - 1))
            except OSError as e:
                missing(f"cannot choose the next pid through {NS_LAST_PID} (needs root): {e}")
            proc = subprocess.Popen(argv, **popen_args)
            if proc.pid == pid:
                return proc
            proc.kill()
            proc.communicate()  # reaps it and closes its pipes
    pytest.fail(f"pid {pid} went to other processes 1000 times: this machine starts processes too fast")
