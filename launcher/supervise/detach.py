"""A detached launch: the run gets a supervisor process of its own, and `mgpu launch` returns.

The launch forks before it checks anything (no thread runs yet, so the fork is safe). The child
goes on as a foreground launch would, on the same terminal: its checks, its errors and their exit
codes are the user's to see. Once its run has begun, the child moves its console to
<run dir>/console.log, takes standard input from /dev/null and leaves the terminal's session
(setsid), then tells the parent through a pipe; the parent prints the run id and the commands that
follow it, and exits 0. If the child ends before that, the parent exits with the child's code.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading

STARTED = b"started\n"


@dataclasses.dataclass
class Child:
    """The supervisor's side: `let_go` is called once the run has begun and the console has moved."""

    pipe: int

    def let_go(self) -> None:
        os.setsid()
        try:
            os.write(self.pipe, STARTED)
        except OSError:  # the launching process is gone already: nobody to tell
            pass
        os.close(self.pipe)


def fork() -> Child | int:
    """In the child: its Child. In the parent: the exit code `mgpu launch` should end with, once the
    child has let go of the terminal (0) or ended before that (its own code)."""
    if threading.active_count() > 1:  # a fork copies only this thread: the others' locks could stay held
        raise RuntimeError("a detached launch must fork before any thread starts")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, or its reader gone: what it held is lost
            pass
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.set_inheritable(write_end, False)
        return Child(write_end)
    os.close(write_end)
    # Ctrl-C and a hang-up reach the child too (the same terminal, the same group): it answers them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(pid, signal.SIGTERM))
    message = b""
    while True:
        try:
            piece = os.read(read_end, len(STARTED))
        except InterruptedError:
            continue
        if not piece:
            break
        message += piece
    os.close(read_end)
    if message == STARTED:
        return 0
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def announce(text: str) -> None:
    """What the launching process prints on stdout once the run has begun. Where stdout's reader
    has gone (a pipe into a program that ended), the run goes on all the same: its first line, the
    run id, goes to stderr instead, and the launch still ends with 0."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)  # what the stream still holds is flushed there at exit
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        try:
            sys.stderr.write(text.splitlines()[0] + " (standard output is closed)\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
