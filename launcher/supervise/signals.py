"""The signals a supervised run records instead of dying from them."""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Signals:
    """Records SIGINT and SIGTERM (stop the run) and SIGHUP (the terminal is gone: the run goes
    on without it) instead of dying, while installed."""

    def __init__(self, stop_on_hang_up: bool = False) -> None:
        """`stop_on_hang_up`: SIGHUP is recorded as a stop signal (before a run has begun, with no
        console.log to move to, a hang-up ends the launch)."""
        self.received: list[int] = []
        self.hung_up = False
        self._stop_on_hang_up = stop_on_hang_up
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Signals":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._record)
            self._previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._hang_up)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def kill_now(self, seen: int) -> bool:
        """Whether a stop begun after `seen` signals skips what is left of the grace period: a SIGINT
        came with another signal, before or during the stop (Ctrl-C twice; `mgpu stop --now` sends
        SIGTERM and SIGINT, which the kernel may hand over in either order), or during a stop no
        signal began. Only SIGTERMs (a second `mgpu stop`) wait for the stop under way."""
        return signal.SIGINT in self.received and len(self.received) > min(seen, 1)

    def _record(self, signum: int, frame: object) -> None:
        self.received.append(signum)  # only a list append: safe at any point of the main thread

    def _hang_up(self, signum: int, frame: object) -> None:
        if self._stop_on_hang_up:
            self.received.append(signum)
            return
        self.hung_up = True  # the supervisor's loop moves the console to console.log
