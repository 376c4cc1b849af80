"""An SSH channel's stdout or stderr as a binary stream that reads whole lines fast, and that can
take out of it the reports a remote helper writes into it (framed lines, see take_reports)."""

from __future__ import annotations

import io
import socket
from typing import Callable

import paramiko

# A report longer than this after its marker is not one: its bytes stay in the stream.
MAX_REPORT_BYTES = 256


class ChannelStream(io.RawIOBase):
    """A channel's stdout or stderr as a binary stream with readline().

    Reads in large chunks and splits lines itself (paramiko's file objects go
    byte-wise through Python and are several times slower). At end of stream,
    a lost connection is reported as one last line.
    """

    _CHUNK = 65536

    def __init__(self, recv, on_eof=None):
        super().__init__()
        self._recv = recv
        self._buffer = bytearray()
        self._eof = False
        self.on_eof = on_eof
        self._marker = b""
        self._on_report: Callable[[bytes], None] | None = None
        self._held = bytearray()  # what may be the start of a report: its end has not come yet

    def take_reports(self, marker: bytes, on_report: Callable[[bytes], None]) -> None:
        """From now on, each `marker` + report + newline that is read from the stream is taken out
        of it, wherever it lands (even inside a line of the stream's own), and its report handed to
        `on_report`. A writer that writes each framed report at once (a pipe keeps such small
        writes whole) then shares the stream with the task, whose bytes stay exactly as they were.

        That includes what has arrived but not been read: the caller reads its own first line before
        (the wrapper's process group), and the chunk that brought it may bring the task's first
        output and a report after it, on a loaded launcher machine."""
        self._marker = marker
        self._on_report = on_report
        arrived = bytes(self._buffer)
        self._buffer.clear()
        self._buffer += self._without_reports(arrived)
        if self._eof:  # no more chunks: what may have begun a report is the stream's own
            self._buffer += self._held
            self._held.clear()

    def readable(self) -> bool:
        return True

    def unread(self, data: bytes) -> None:
        self._buffer[:0] = data

    def readline(self, size: int = -1) -> bytes:
        """One line, or its first `size` bytes when it is longer (as io's readline does), so that
        output without newlines never grows the buffer beyond a chunk and a line."""
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0 and (size < 0 or end < size):
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line
            if 0 <= size <= len(self._buffer):
                line = bytes(self._buffer[:size])
                del self._buffer[:size]
                return line
            if self._eof:
                break
            start = len(self._buffer)
            self._fill()
        if self._buffer:
            cut = len(self._buffer) if size < 0 else size
            line = bytes(self._buffer[:cut])
            del self._buffer[:cut]
            return line
        if self.on_eof is not None:
            note, self.on_eof = self.on_eof(), None
            return note
        return b""

    def read1(self, size: int = -1) -> bytes:
        """What has arrived, at most `size` bytes, waiting only when nothing has (a partial line too)."""
        while not self._eof and not self._buffer:
            self._fill()
        if not self._buffer:
            if self.on_eof is not None:
                note, self.on_eof = self.on_eof(), None
                return note
            return b""
        size = len(self._buffer) if size is None or size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _fill(self) -> None:
        try:
            chunk = self._recv(self._CHUNK)
        except (OSError, EOFError, paramiko.SSHException) as e:
            if isinstance(e, socket.timeout):
                raise
            chunk = b""
        if not chunk:
            self._eof = True
            self._buffer += self._held  # an unfinished report is the stream's own bytes
            self._held.clear()
        elif self._on_report is None:
            self._buffer += chunk
        else:
            self._buffer += self._without_reports(chunk)

    def _without_reports(self, chunk: bytes) -> bytes:
        """`chunk` (after what was held back) less the reports in it; what may begin one is held back."""
        data = bytes(self._held) + chunk
        self._held.clear()
        kept = bytearray()
        start = 0
        while True:
            found = data.find(self._marker, start)
            if found < 0:
                break
            end = data.find(b"\n", found + len(self._marker), found + len(self._marker) + MAX_REPORT_BYTES)
            if end < 0:
                if len(data) - found - len(self._marker) < MAX_REPORT_BYTES:  # its end may come yet
                    kept += data[start:found]
                    self._held += data[found:]
                    return bytes(kept)
                kept += data[start:found + 1]  # too long to be a report: the stream's own
                start = found + 1
                continue
            kept += data[start:found]
            self._on_report(data[found + len(self._marker):end])
            start = end + 1
        tail = data[start:]
        # The stream may end with the first bytes of a marker.
        for size in range(min(len(tail), len(self._marker) - 1), 0, -1):
            if self._marker.startswith(tail[-size:]):
                kept += tail[:-size]
                self._held += tail[-size:]
                return bytes(kept)
        kept += tail
        return bytes(kept)

    def readinto(self, buffer) -> int:
        line = self.readline(len(buffer))
        buffer[: len(line)] = line
        return len(line)
