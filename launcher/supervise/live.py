"""Lines that redraw in place: progress bars drawn with `\\r`, and the built-in trainer's progress.

A task that redraws one line with carriage returns (Keras' progress bar, tqdm) would otherwise
show nothing until the line ends, then one huge line. The console shows each such line's latest
state at a bounded rate instead:

- on a terminal, as a block at the bottom of the console, one line per task, repainted in
  place at most once per `interval`; ordinary lines scroll above it;
- elsewhere (a pipe, a file), as an ordinary line per task at most once per `interval`.

The log files are not concerned: they keep every byte.
"""

from __future__ import annotations

import time

from launcher import protocol

TERMINAL_INTERVAL = 1.0  # seconds between repaints of a line on a terminal
PLAIN_INTERVAL = 10.0  # seconds between two plain lines of the same task's redraws
_UP_AND_CLEAR = "\x1b[{}A\x1b[J"  # cursor up N lines, clear to the end of the screen


def latest_redraw(text: str) -> str:
    """What a line redrawn with carriage returns shows last: its last non-blank part, without the
    backspaces some bars (Keras') send before each redraw."""
    for part in reversed(text.split("\r")):
        part = part.replace("\b", "")
        if part.strip():
            return part
    return ""


class LiveLines:
    """The latest redraw of each live line and what the console last showed of it.

    Not thread-safe: the console calls it under its own lock. Keys name a task's stream;
    `render` returns the text to write, given the ordinary lines that go out with it.
    """

    def __init__(self, terminal: bool, interval: float | None = None, width: int = 0):
        self.terminal = terminal
        self.interval = interval if interval is not None else (TERMINAL_INTERVAL if terminal else PLAIN_INTERVAL)
        self._width = width  # terminal columns; longer lines are cut so the block never wraps
        self._latest: dict[str, str] = {}
        self._shown: dict[str, str] = {}
        self._shown_at: dict[str, float] = {}
        self._drawn = 0  # lines of the block now on the terminal

    def update(self, key: str, text: str) -> None:
        self._latest[key] = text

    def remove(self, key: str) -> str | None:
        """Stop showing `key`; its latest text to print as an ordinary line, if any: on a terminal
        always (its line in the block goes away), elsewhere only if it was never shown."""
        latest = self._latest.pop(key, None)
        shown = self._shown.pop(key, None)
        self._shown_at.pop(key, None)
        return latest if latest is not None and (self.terminal or latest != shown) else None

    def pending(self) -> dict[str, str]:
        """The latest state of every live line, by key."""
        return dict(self._latest)

    def next_due(self, now: float) -> float | None:
        """Seconds until a changed line may be shown; None when nothing changed."""
        waits = [max(0.0, self._shown_at.get(key, -1e9) + self.interval - now)
                 for key, text in self._latest.items() if text != self._shown.get(key)]
        return min(waits) if waits else None

    def render(self, lines: list[str], now: float | None = None, force: bool = False) -> str:
        """The ordinary `lines`, with the live lines that are due (all changed ones if `force`)."""
        now = time.monotonic() if now is None else now
        due = [key for key, text in self._latest.items() if text != self._shown.get(key)
               and (force or now - self._shown_at.get(key, -1e9) >= self.interval)]
        for key in due:
            self._shown[key], self._shown_at[key] = self._latest[key], now
        if not self.terminal:
            return "".join(lines) + "".join(self._shown[key] + "\n" for key in due)
        if not lines and not due and self._drawn == len(self._shown):
            return ""
        erase = _UP_AND_CLEAR.format(self._drawn) if self._drawn else ""
        block = [self._fit(self._shown[key]) + "\n" for key in self._latest if key in self._shown]
        self._drawn = len(block)
        return erase + "".join(lines) + "".join(block)

    def _fit(self, text: str) -> str:
        return text[: self._width - 1] if self._width > 1 else text


class ProgressMeter:
    """The built-in trainer's progress lines (protocol.PROGRESS_PREFIX) as a tqdm bar with rate and ETA."""

    def __init__(self, terminal: bool, width: int):
        self._terminal = terminal
        self._width = width
        self._start: tuple[float, int] | None = None  # when the first progress line came, at which step

    def render(self, line: str, prefix_width: int, now: float | None = None) -> str | None:
        """The bar for one progress line; None if `line` is not one."""
        parsed = protocol.parse_progress(line)
        if parsed is None:
            return None
        from tqdm import tqdm  # only runs that report progress need it

        step, total = parsed
        now = time.monotonic() if now is None else now
        if self._start is None or step < self._start[1]:
            self._start = (now, step)
        started_at, first_step = self._start
        columns = max(40, (self._width if self._terminal else 100) - prefix_width - 1)
        return tqdm.format_meter(step, total or None, now - started_at, ncols=columns, unit=" steps",
                                 initial=first_step, ascii=not self._terminal)
