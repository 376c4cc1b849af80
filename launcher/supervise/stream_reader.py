"""The reader of one of a task's streams: drains it to its end, whatever it carries.

Every byte read goes to the task's log (task_log.py) exactly as read; every line goes to the
task's watchers (watchers.py), a line longer than PIECE in pieces of PIECE bytes. Only the end
of the stream, or its closing under the reader, ends the loop: nothing a task prints can stop
it, so the task never blocks on a full pipe and its log stays complete.
"""

from __future__ import annotations

from typing import BinaryIO, Callable

from launcher.supervise.task_log import TaskLog
from launcher.supervise.watchers import Watchers

READ_SIZE = 64 * 1024
PIECE = 64 * 1024  # the watchers (and so the console) see a longer line in pieces
REDRAW_TAIL = 8 * 1024  # how much of a line being redrawn is searched for its latest state


def read_stream(stream: BinaryIO, stdout: bool, log: TaskLog, watchers: Watchers,
                activity: Callable[[], None]) -> None:
    """Read `stream` to its end; `activity` is called after each read that brought bytes."""
    pending = bytearray()
    while True:
        try:
            data = stream.read1(READ_SIZE)
        except TimeoutError:  # a stream with a read timeout is still open
            continue
        except (OSError, ValueError):  # the stream was closed under us: the task's view was released
            data = b""
        if not data:
            break
        activity()
        log.write(stdout, data)
        pending += data
        start = 0
        while (end := pending.find(b"\n", start, start + PIECE)) >= 0 or len(pending) - start >= PIECE:
            end = end + 1 if end >= 0 else start + PIECE
            watchers.line(bytes(pending[start:end]), stdout)
            start = end
        del pending[:start]
        if b"\r" in pending:
            watchers.partial(bytes(pending[-REDRAW_TAIL:]), stdout)
    if pending:
        watchers.line(bytes(pending), stdout)
    log.end(stdout)
