"""A process started on a pid chosen by the test: the kernel hands pids out again, and code that
keeps a process by its pid must tell the new program from the old one (needs root)."""

from __future__ import annotations

import subprocess

import pytest

from needs import missing

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _write_last_pid(value: int) -> None:
    try:
        with open(NS_LAST_PID, "w") as f:
            f.write(str(value))
    except OSError as e:
        missing(f"cannot choose the next pid through {NS_LAST_PID} (needs root): {e}")


def start_with_pid(pid: int, argv: list[str], **popen_args) -> subprocess.Popen:
    """`argv` started as process `pid` again. Another process of the machine may take the pid between
    the write and the fork: then it tries again, up to 1000 times. The machine's next pid is put back
    where it was after, so that other processes do not go on taking pids just freed."""
    with open(NS_LAST_PID) as f:
        before = int(f.read())
    try:
        for _ in range(1000):
            _write_last_pid(pid - 1)
            proc = subprocess.Popen(argv, **popen_args)
            if proc.pid == pid:
                return proc
            proc.kill()
            proc.wait()
    finally:
        with open(NS_LAST_PID) as f:
            _write_last_pid(max(before, int(f.read())))
    pytest.fail(f"pid {pid} went to other processes 1000 times: this machine starts processes too fast")
