"""The launcher's end of a task's stdout and stderr pipes, for the backends whose tasks write into
pipes of this process (local processes, and the srun of a Slurm step): reads that close() from
another thread can end."""

from __future__ import annotations

import io
import os
import select

READ_BUFFER = 64 * 1024
STOP_CHECK_MS = 200  # how often a waiting read looks whether the stream is being closed


class _PipeReadEnd(io.RawIOBase):
    """The launcher's end of a task's stdout or stderr pipe.

    A read waits in short polls, so that close() from another thread can end it:
    a process that left the run (and so escaped every stop) may hold the other
    end open forever, and closing the pipe must still release it.
    """

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        self._stopping = False
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        self._checkClosed()
        return self._fd

    def stop(self) -> None:
        """Make a waiting read, and every later one, return end of file."""
        self._stopping = True

    def readinto(self, buffer) -> int:
        while not self._stopping:
            if self._poller.poll(STOP_CHECK_MS):  # data, end of file or an error: read says which
                return os.readv(self._fd, [buffer])
        return 0

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self._fd)
            finally:
                super().close()


def pipe_reader(fd: int) -> io.BufferedReader:
    """A buffered reader of a pipe's read end that close() from another thread can interrupt."""
    return io.BufferedReader(_PipeReadEnd(fd), READ_BUFFER)


def close_pipe_readers(*streams: io.BufferedReader) -> None:
    """Close streams made by pipe_reader. A reader thread may still wait on one; stop() ends
    that wait, and close() then gets the stream's lock and releases the pipe."""
    for stream in streams:
        stream.raw.stop()
        try:
            stream.close()
        except OSError:
            pass
