"""What the launcher does with each line of a task's output, one small watcher per concern.

A stream reader (stream_reader.py) hands every line to a Watchers list: the ready line,
bind failures, the tail kept for the failure summary, and the console view (noise filter,
progress bar, lines redrawn with carriage returns). A watcher that raises is a bug in that
watcher: it is reported once, skips the line it failed on, and never stops the reader, the
log or the other watchers.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import threading
import time
from typing import Callable, Iterable

from launcher import protocol
from launcher.supervise import diagnosis
from launcher.supervise.console_text import console_safe
from launcher.supervise.live import ProgressMeter, latest_redraw

TAIL_LINE_CHARS = 4000
ERROR_CHARS = 200  # of a failing watcher's exception message, in its report


@dataclasses.dataclass(frozen=True)
class Line:
    raw: bytes  # as read: a line with its newline, a stream's last bytes, or a piece of a longer line
    text: str  # decoded, without its line end; of a line redrawn with \r, what it shows last
    stdout: bool


class LineWatcher:
    """Sees every line of one task's output (from both streams, one line at a time)."""

    name = "line watcher"

    def line(self, line: Line) -> None:
        raise NotImplementedError

    def partial(self, text: str, stdout: bool) -> None:
        """The end of a line still being redrawn with carriage returns (decoded)."""

    def close(self) -> None:
        """The task's output is closed (its streams may still be read)."""


class Watchers:
    """Hands each line to every watcher in turn; a watcher's exception is reported, once."""

    def __init__(self, watchers: Iterable[LineWatcher], report: Callable[[str], None], task_name: str):
        self._watchers = list(watchers)
        self._report = report
        self._task_name = task_name
        self._failed: set[int] = set()
        self._lock = threading.Lock()  # the two streams' readers take turns

    def line(self, raw: bytes, stdout: bool) -> None:
        with self._lock:
            line = Line(raw, latest_redraw(raw.decode("utf-8", "replace").rstrip("\r\n")), stdout)
            for watcher in self._watchers:
                self._call(watcher, watcher.line, line)

    def partial(self, raw: bytes, stdout: bool) -> None:
        with self._lock:
            text = raw.decode("utf-8", "replace")
            for watcher in self._watchers:
                self._call(watcher, watcher.partial, text, stdout)

    def close(self) -> None:
        with self._lock:
            for watcher in self._watchers:
                self._call(watcher, watcher.close)

    def _call(self, watcher: LineWatcher, method, *args) -> None:
        try:
            method(*args)
        except Exception as exc:  # a bug in that watcher: the reader and the other watchers go on
            if id(watcher) in self._failed:
                return
            self._failed.add(id(watcher))
            message = str(exc)
            message = message if len(message) <= ERROR_CHARS else message[:ERROR_CHARS] + "..."
            self._report(console_safe(
                f"internal error: the {watcher.name} of {self._task_name} failed ({type(exc).__name__}: "
                f"{message}); it skips the lines it fails on, the log keeps every byte"))


class ReadyWatcher(LineWatcher):
    """protocol.READY_LINE, alone on stdout, sets `ready`."""

    name = "ready-line watcher"

    def __init__(self, ready: threading.Event):
        self._ready = ready

    def line(self, line: Line) -> None:
        if line.stdout and line.text.strip() == protocol.READY_LINE:
            self._ready.set()


class BindFailureWatcher(LineWatcher):
    """The first line saying the task's port could not be bound: `port` (0: unnamed), else None."""

    name = "bind-failure watcher"

    def __init__(self) -> None:
        self.port: int | None = None

    def line(self, line: Line) -> None:
        if self.port or not ("bind" in line.text or "ddress" in line.text or "gRPC server" in line.text):
            return
        port = diagnosis.bind_failure(line.text)
        if port is not None:
            self.port = port


class TailWatcher(LineWatcher):
    """The last lines, each cut to TAIL_LINE_CHARS, for the failure summary."""

    name = "tail watcher"

    def __init__(self, tail: collections.deque[diagnosis.TaskLine]):
        self._tail = tail

    def line(self, line: Line) -> None:
        self._tail.append(diagnosis.TaskLine(line.text[:TAIL_LINE_CHARS], stderr=not line.stdout))


class ConsoleWatcher(LineWatcher):
    """The task's prefixed view on the console (output.Console).

    TensorFlow's C++ chatter is left out unless `show_tf_logs`; the ready line too (the
    supervisor announces readiness once for all). Progress lines of the protocol become a
    bar, and a line redrawn with carriage returns is shown live while it grows.
    """

    name = "console view"

    def __init__(self, console, prefix: str, stamp: Callable[[], str], show_tf_logs: bool):
        self._console = console
        self._prefix = prefix
        self._stamp = stamp
        # One per stream: a record's continuation lines follow it on its own stream.
        self._noise = None if show_tf_logs else {stdout: diagnosis.NoiseFilter(blank_lines_shown=True)
                                                 for stdout in (True, False)}
        self._meter = ProgressMeter(console.terminal, console.width)
        self._live_keys: set[str] = set()
        self.muted = False  # set from the supervisor's thread: what comes after stays off the console

    def line(self, line: Line) -> None:
        text = line.text
        if self.muted or (line.stdout and (text.strip() == protocol.READY_LINE
                                           or protocol.parse_time_split(text) is not None
                                           or protocol.parse_checkpoint(text) is not None)):
            return  # the time split and the checkpoints are the launcher's to read: the log keeps them
        if self._noise is not None and self._noise[line.stdout].is_noise(text):
            return  # a blank line is the program's own spacing, shown, unless it ends a noisy record
        text = console_safe(text)  # after latest_redraw has taken the last state of a redrawn line
        bar = self._meter.render(text, len(self._prefix)) if line.stdout else None
        key = self._live_key(line.stdout)
        if bar is not None:
            step, total = protocol.parse_progress(text)
            if total and step >= total:  # complete: stays where it ends, before later lines
                self._live_keys.discard(self._prefix + "progress")
                self._console.end_live(self._prefix + "progress", self._stamped(bar))
            else:
                self._live_keys.add(self._prefix + "progress")
                self._console.set_live(self._prefix + "progress", self._stamped(bar))
        elif key in self._live_keys:  # the redrawn line ended: its last state is an ordinary line
            self._live_keys.discard(key)
            self._console.end_live(key, self._stamped(text))
        else:
            self._console.write_line(self._stamped(text) + "\n")

    def partial(self, text: str, stdout: bool) -> None:
        text = console_safe(latest_redraw(text))
        if text and not self.muted:
            self._live_keys.add(self._live_key(stdout))
            self._console.set_live(self._live_key(stdout), self._stamped(text))

    def close(self) -> None:
        """A progress bar's or a redrawn line's last state stays on the console."""
        for key in sorted(self._live_keys):
            self._console.end_live(key)
        self._live_keys.clear()

    def _live_key(self, stdout: bool) -> str:
        return self._prefix + ("out" if stdout else "err")

    def _stamped(self, text: str) -> str:
        return f"{self._stamp()}{self._prefix}{text}"


LAST_LINE_CHARS = 300


class ProgressWatcher(LineWatcher):
    """The task's last line and its progress lines (protocol.py). For `mgpu status`: step, total,
    the rate since its first progress line and the time left at that rate. For the restart rules:
    the first and the highest step reported, and when (time.time()) the highest was first reached,
    which tell whether a restart made progress and what a failure cost; for the lost-time split
    (lost_time.py), when the first step line came, when a step at or above `resume_step` (the best
    step before this attempt) first came, and how many lines raised the step."""

    name = "progress watcher"

    def __init__(self, clock: Callable[[], float]):
        self._clock = clock  # seconds, for the rate
        self._lock = threading.Lock()
        self._last_line: str | None = None
        self._first: tuple[float, int] | None = None  # (when, step) of the first progress line
        self._last: tuple[float, float, int, int] | None = None  # (when, wall time, step, total)
        self.first: int | None = None  # the first step reported
        self.step: int | None = None  # the highest
        self.step_at: float | None = None
        self.resume_step: int | None = None  # set before the first line
        self.first_at: float | None = None
        self.caught_up_at: float | None = None
        self.rises = 0  # lines that raised the highest step, after the first

    def line(self, line: Line) -> None:
        parsed = protocol.parse_progress(line.text) if line.stdout else None
        now = self._clock()
        with self._lock:
            if parsed is None:
                if line.text.strip() and not (line.stdout and (protocol.parse_time_split(line.text)
                                                               or protocol.parse_checkpoint(line.text) is not None)):
                    self._last_line = console_safe(line.text[:LAST_LINE_CHARS])
                return
            step, total = parsed
            wall = time.time()
            if self.first is None:
                self.first, self.first_at = step, wall
            if self.caught_up_at is None and (self.resume_step is None or step >= self.resume_step):
                self.caught_up_at = wall
            if self.step is None or step > self.step:
                self.rises += self.step is not None
                self.step, self.step_at = step, wall
            if self._first is None or step < self._first[1]:
                self._first = (now, step)
            self._last = (now, wall, step, total)

    def snapshot(self) -> tuple[str | None, dict | None]:
        """(last line, progress as run.json writes it, or None before any)."""
        with self._lock:
            if self._last is None:
                return self._last_line, None
            when, wall, step, total = self._last
            first_when, first_step = self._first
            rate = (step - first_step) / (when - first_when) if when > first_when and step > first_step else None
            eta = (total - step) / rate if rate and total and total >= step else None
            at = datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(timespec="seconds")
            return self._last_line, {"step": step, "total": total or None,
                                     "rate": None if rate is None else round(rate, 3),
                                     "eta_s": None if eta is None else round(eta, 1), "at": at}


class TimeSplitWatcher(LineWatcher):
    """The task's own compute/wait split (protocol.TIME_SPLIT_PREFIX lines on stdout), summed:
    milliseconds computing and waiting since its start, for the rule that names the slow task."""

    name = "time split watcher"

    def __init__(self):
        self._lock = threading.Lock()
        self._total: tuple[int, int] | None = None

    def line(self, line: Line) -> None:
        parsed = protocol.parse_time_split(line.text) if line.stdout else None
        if parsed is not None:
            with self._lock:
                compute, wait = self._total or (0, 0)
                self._total = (compute + parsed[0], wait + parsed[1])

    def total(self) -> tuple[int, int] | None:
        """(compute ms, wait ms) in all; None before the first line."""
        with self._lock:
            return self._total


class CheckpointWatcher(LineWatcher):
    """The checkpoints the task said it saved (protocol.CHECKPOINT_PREFIX lines on stdout): how many,
    and the last step, for the rule that takes a host back right after one."""

    name = "checkpoint watcher"

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self.step: int | None = None

    def line(self, line: Line) -> None:
        step = protocol.parse_checkpoint(line.text) if line.stdout else None
        if step is not None:
            with self._lock:
                self.count += 1
                self.step = step
