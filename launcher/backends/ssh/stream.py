"""An SSH channel's stdout or stderr as a binary stream that reads whole lines fast."""

from __future__ import annotations

import io
import socket

import paramiko


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
        self._buffer += chunk

    def readinto(self, buffer) -> int:
        line = self.readline(len(buffer))
        buffer[: len(line)] = line
        return len(line)
