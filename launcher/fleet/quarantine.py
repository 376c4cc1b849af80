"""Hosts a run leaves out for a fault of their own, written to this user's quarantine
(host/quarantine_file.py), so that later runs avoid them until the expiry."""

from __future__ import annotations

import time
from typing import Callable, Mapping

from launcher.config import quarantine
from launcher.host.quarantine_file import QuarantineFile


def remember(why: Mapping[str, str], run_id: str, duration: float, notice: Callable[[str], None]) -> None:
    """Each host of `why` ('cause: detail') quarantined for `duration` seconds; said in one notice.
    A file that cannot be written is a warning: the run goes on."""
    if not why:
        return
    keeper = QuarantineFile(warn=lambda text: notice(f"warning: {text}"))
    if keeper.add(quarantine.entries_for(why, run_id, time.time(), duration)):
        notice(f"quarantined {', '.join(why)} for {_duration(duration)} ({keeper.path}; "
               f"`mgpu hosts --clear HOST` lifts it)")


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
