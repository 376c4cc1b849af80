"""The bar a large `--sync` copy draws on a terminal."""

from __future__ import annotations

import threading
from typing import TextIO

from launcher.config.sync import human_bytes

PROGRESS_FROM_BYTES = 16 << 20  # a bar only for copies this large


class SyncProgress:
    """A bar on a terminal while a large copy runs: bytes sent to every host together."""

    def __init__(self, err: TextIO):
        self._err = err
        self._total = 0
        self._done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def expect(self, size: int) -> None:
        with self._lock:
            self._total += size
            start = self._thread is None and self._total >= PROGRESS_FROM_BYTES and _is_terminal(self._err)
            if start:
                self._thread = threading.Thread(target=self._draw_until_stopped, daemon=True, name="mgpu-sync-bar")
        if start:
            self._thread.start()

    def add(self, size: int) -> None:
        with self._lock:
            self._done += size

    def _draw_until_stopped(self) -> None:
        while not self._stop.wait(0.2):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            done, total = self._done, max(self._total, 1)
        width = 30
        filled = min(width, done * width // total)
        self._err.write(f"\r\x1b[Kmgpu: syncing [{'#' * filled}{' ' * (width - filled)}] "
                        f"{human_bytes(done)} / {human_bytes(total)}")
        self._err.flush()
        self._shown = True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            if self._shown:
                self._err.write("\r\x1b[K")
                self._err.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
