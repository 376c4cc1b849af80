"""mgpu's standard streams when they are not there: closed at the start (`mgpu launch ... >&-`), or
whose reader has gone (`mgpu check | head -1`, a pipe into a program that ended).

A closed descriptor 0, 1 or 2 is given /dev/null before anything is opened: else the next file
opened takes its number, and what is printed lands in it (a run's log, run.json). Standard output
closed at the start is said once on stderr; a launch then runs as it would, its tasks' output in
their log files. A reader that goes while mgpu writes ends the command with one line and
OutputClosed's code; a launch's console is not written that way (supervise/output.py goes on
without it) and a detached launch's announcement falls back to stderr (supervise/detach.py).
"""

from __future__ import annotations

import os
import select
import sys

CLOSED_STDOUT_WARNING = ("mgpu: warning: standard output is closed: what mgpu prints there is discarded "
                         "(a run's tasks still write their log files)\n")


def open_standard_streams() -> None:
    """/dev/null for each of descriptors 0, 1 and 2 that is closed, and a Python stream on it."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:  # the lowest free number first: each open takes the one it fills
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    if 0 in closed:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # the process's own: never closed
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if fd in closed:
            setattr(sys, name, open(fd, "w", encoding="utf-8", errors="backslashreplace", buffering=1,
                                    closefd=False))
    if 1 in closed and 2 not in closed:
        sys.stderr.write(CLOSED_STDOUT_WARNING)
        sys.stderr.flush()


def stdout_gone() -> bool:
    """Whether standard output's reader has gone (a pipe without one, a hung-up terminal): the
    kernel says so to poll() as an error or a hang-up on the descriptor."""
    poller = select.poll()
    poller.register(1, select.POLLOUT)
    try:
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except OSError:
        return True


def discard_stdout() -> None:
    """/dev/null on descriptor 1, so that what Python still holds for it is flushed there at exit
    (not a second error about the closed pipe)."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
