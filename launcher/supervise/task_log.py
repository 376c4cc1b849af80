"""A task's log file: the bytes of its stdout and stderr exactly as read, in whole lines.

Both streams go to one file, so a line of one is never cut by a line of the other: each
stream's bytes wait until they end a line, and a line longer than PIECE is written as it
arrives, in pieces with nothing added between them, while the other stream's lines wait
for it to end (in memory, up to HOLD). The log differs from what the task wrote only where
that cannot be avoided, and then by one newline: before the other stream's lines when a line
goes on past HOLD of them, or when a stream ended in the middle of a line.
"""

from __future__ import annotations

import threading
from typing import BinaryIO, Callable

PIECE = 64 * 1024  # a longer unfinished line is written as it arrives
HOLD = 4 * 1024 * 1024  # how much of one stream waits for the other's long line to end


class TaskLog:
    """Writes what a task's two streams (True: stdout, False: stderr) read to one log file.

    Thread-safe: each stream's reader calls write() and end() from its own thread. A log
    that cannot be written (a full disk) is reported once through `report`; the streams
    are still read to their end.
    """

    def __init__(self, file: BinaryIO, report: Callable[[str], None], name: str):
        self._file = file
        self._report = report
        self._name = name
        self._lock = threading.Lock()
        self._held = {True: bytearray(), False: bytearray()}  # read, not yet written
        self._ended: set[bool] = set()
        self._mid_line: bool | None = None  # the stream whose line the file ends in the middle of
        self._failed = False
        self.ends_mid_line = False  # the file's last byte is not a newline

    def write_own(self, data: bytes) -> None:
        """A line of the launcher's own (an attempt's header), between the task's lines."""
        with self._lock:
            self._emit(data)

    def write(self, stdout: bool, data: bytes) -> None:
        with self._lock:
            self._held[stdout] += data
            self._drain(stdout)

    def end(self, stdout: bool) -> None:
        """The stream reached its end: what it left unfinished is written as it is."""
        with self._lock:
            self._ended.add(stdout)
            self._drain(stdout)

    def flush(self) -> None:
        with self._lock:
            self._call(self._file.flush)

    def close(self) -> None:
        """Write what both streams left (even where a reader is still waiting) and close the file."""
        with self._lock:
            self._ended.update((True, False))
            self._drain(True)
            self._drain(False)
            try:
                self._file.close()
            except (OSError, ValueError) as exc:
                self._failure(exc)

    def _drain(self, stdout: bool) -> None:
        self._flush(stdout)
        self._flush(not stdout)  # its lines may have waited for this stream's line to end

    def _flush(self, stdout: bool) -> None:
        held = self._held[stdout]
        cut = held.rfind(b"\n") + 1
        if stdout in self._ended or len(held) - cut > PIECE or (self._mid_line == stdout and not cut):
            cut = len(held)
        if not cut:
            return
        if self._mid_line is not None and self._mid_line != stdout:
            if self._mid_line not in self._ended and len(held) <= HOLD:
                return  # wait for the other stream's line to end
            self._emit(b"\n")
            self._mid_line = None
        self._emit(bytes(held[:cut]))
        del held[:cut]
        self._mid_line = stdout if self.ends_mid_line else None

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        self._call(self._file.write, data)
        self.ends_mid_line = not data.endswith(b"\n")

    def _call(self, method, *args) -> None:
        if self._failed or self._file.closed:
            return
        try:
            method(*args)
        except (OSError, ValueError) as exc:
            self._failure(exc)

    def _failure(self, exc: Exception) -> None:
        if not self._failed and not isinstance(exc, ValueError):  # ValueError: closed, nothing to say
            self._report(f"cannot write the log of {self._name}: {exc}; its output is still read, "
                         "but lost from here on")
        self._failed = True
