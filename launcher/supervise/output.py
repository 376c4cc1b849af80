"""Task output: the prefixed console view and the per-task log files.

Two reader threads per task drain its stdout and stderr line by line, so a task
never blocks on a full pipe. Every line goes, unprefixed, to
<run dir>/<type>-<index>.log (a line longer than 64 KiB is cut into pieces, so
lines from the two streams never mix); after a restart the same file continues
below a "----- mgpu: attempt N started <time> -----" line. The console gets each line whole, prefixed with the task's name
("[worker:1] "), optionally with a time, and only for the tasks `show` selects;
TensorFlow's C++ chatter (diagnosis.is_noise: INFO and WARNING records, the
notices every GPU-less start prints) stays off the console unless asked for.
Console lines wait in a bounded buffer written by one thread; if the console
cannot keep up (a paused pager, a slow terminal), lines are dropped from the
console, never from the log, and a notice says how many.

A line that a task redraws with carriage returns, and the progress lines of the
protocol, are shown live at a bounded rate (live.py) instead of whole: the
console sees the latest state while the line grows, the log gets every byte.
"""

from __future__ import annotations

import collections
import datetime
import os
import pathlib
import shutil
import threading
import time
from typing import BinaryIO, TextIO

from launcher import protocol
from launcher.plan.planner import TaskPlan
from launcher.supervise import diagnosis
from launcher.supervise.console_text import console_safe
from launcher.supervise.live import LiveLines, ProgressMeter, latest_redraw
from launcher.supervise.rundir import RunDir

CHUNK = 64 * 1024  # a longer line is shown in pieces
REDRAW_TAIL = 8 * 1024  # how much of a line being redrawn is searched for its latest state
TAIL_LINES = 500  # kept per task for the failure summary, which finds the cause in them
TAIL_LINE_CHARS = 4000
CONSOLE_BUFFER_CHARS = 8 * 1024 * 1024
LAUNCHER_PREFIX = "[mgpu] "


def log_name(plan: TaskPlan) -> str:
    return f"{plan.type}-{plan.index}.log"


def _clock() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3] + " "


class Console:
    """Writes whole lines to a text stream from one thread; never blocks the caller."""

    def __init__(self, stream: TextIO, max_pending_chars: int = CONSOLE_BUFFER_CHARS,
                 terminal: bool | None = None, live_interval: float | None = None):
        self._stream = stream
        self.terminal = _is_terminal(stream) if terminal is None else terminal
        self.width = shutil.get_terminal_size().columns if self.terminal else 0
        self._live = LiveLines(self.terminal, live_interval, self.width)
        self._max_pending = max_pending_chars
        self._cond = threading.Condition()
        self._pending: collections.deque[str] = collections.deque()
        self._pending_chars = 0
        self._dropped = 0
        self._closing = False
        self._broken = False
        self._thread = threading.Thread(target=self._run, name="mgpu-console", daemon=True)
        self._thread.start()

    def write_line(self, line: str, always: bool = False) -> None:
        """Queue one line (with its newline). Dropped if the buffer is full, unless `always`."""
        with self._cond:
            if self._broken or self._closing:
                return
            if not always and self._pending_chars + len(line) > self._max_pending:
                self._dropped += 1
                return
            self._pending.append(line)
            self._pending_chars += len(line)
            self._cond.notify()

    def set_live(self, key: str, text: str) -> None:
        """The latest state of a line that redraws in place (shown at a bounded rate)."""
        with self._cond:
            self._live.update(key, text)
            self._cond.notify()

    def end_live(self, key: str, final: str | None = None) -> None:
        """`key` stops redrawing; `final` (or, if None, a state never shown) becomes an ordinary line."""
        with self._cond:
            unseen = self._live.remove(key)
            line = final if final is not None else unseen
            if line is not None and not self._broken:
                self._pending.append(line + "\n")
                self._pending_chars += len(line) + 1
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (waiting at most `timeout`) and stop the writer thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    due = self._live.next_due(time.monotonic())
                    if due == 0.0:
                        break
                    self._cond.wait(due)
                batch = list(self._pending)
                self._pending.clear()
                self._pending_chars = 0
                dropped, self._dropped = self._dropped, 0
                last = self._closing
                if dropped:
                    batch.append(f"{LAUNCHER_PREFIX}{dropped} lines not shown here (console too slow); "
                                 f"the log files have them\n")
                text = self._live.render(batch, force=last)
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError):  # console closed (a pipe reader went away): keep running without it
                with self._cond:
                    self._broken = True
                    self._pending.clear()
                return
            if last:
                return


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TaskOutput:
    """One attempt of one task: its log file, console view, last lines and readiness."""

    def __init__(
        self,
        plan: TaskPlan,
        attempt: int,
        log_path: pathlib.Path,
        log: BinaryIO,
        console: Console | None,
        timestamps: bool,
        show_tf_logs: bool = False,
    ):
        self.plan = plan
        self.log_path = log_path
        self.tail: collections.deque[diagnosis.TaskLine] = collections.deque(maxlen=TAIL_LINES)
        self.ready = threading.Event()
        # The port a "could not bind" message named (0: unnamed); None when there was none.
        self.bind_failure: int | None = None
        self._console = console
        self._timestamps = timestamps
        # One per stream: a record's continuation lines follow it on its own stream.
        self._noise = None if show_tf_logs else {True: diagnosis.NoiseFilter(), False: diagnosis.NoiseFilter()}
        self._prefix = f"[{plan.name}] "
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._live_keys: set[str] = set()
        self._meter = ProgressMeter(console.terminal, console.width) if console is not None else None
        self._log = log  # opened in the run dir by RunOutput (rundir.RunDir.open_log)
        if attempt > 0:
            started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            self._log.write(f"----- mgpu: attempt {attempt} started {started} -----\n".encode())

    def attach(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        """Start draining the task's two streams."""
        for stream, is_stdout in ((stdout, True), (stderr, False)):
            thread = threading.Thread(
                target=self._pump,
                args=(stream, is_stdout),
                name=f"mgpu-read-{self.plan.name}-{'out' if is_stdout else 'err'}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def drained(self, timeout: float) -> bool:
        """Wait until both streams reached end of file; False if they did not within `timeout`."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def flush(self) -> None:
        with self._lock:
            if not self._log.closed:
                self._log.flush()

    def close(self) -> None:
        with self._lock:
            self._log.close()
        if self._console is not None:
            for key in sorted(self._live_keys):  # a progress bar's last state stays on the console
                self._console.end_live(key)

    def _pump(self, stream: BinaryIO, is_stdout: bool) -> None:
        """Split the stream into lines; a line still being redrawn with \\r is shown live meanwhile."""
        pending = bytearray()
        try:
            while True:
                data = stream.read1(CHUNK)
                if not data:
                    if pending:
                        self._line(bytes(pending), is_stdout)
                    return
                pending += data
                start = 0
                while (end := pending.find(b"\n", start)) >= 0 or len(pending) - start >= CHUNK:
                    end = end + 1 if 0 <= end < start + CHUNK else start + CHUNK
                    self._line(bytes(pending[start:end]), is_stdout)
                    start = end
                del pending[:start]
                if b"\r" in pending and self._console is not None:
                    self._redraw(bytes(pending[-REDRAW_TAIL:]).decode("utf-8", "replace"), is_stdout)
        except (OSError, ValueError):  # the stream or the log was closed under us
            return

    def _live_key(self, is_stdout: bool) -> str:
        return self._prefix + ("out" if is_stdout else "err")

    def _stamped(self, text: str) -> str:
        return f"{_clock() if self._timestamps else ''}{self._prefix}{text}"

    def _redraw(self, partial: str, is_stdout: bool) -> None:
        text = console_safe(latest_redraw(partial))
        if text:
            self._live_keys.add(self._live_key(is_stdout))
            self._console.set_live(self._live_key(is_stdout), self._stamped(text))

    def _line(self, chunk: bytes, is_stdout: bool) -> None:
        if not chunk.endswith(b"\n"):
            chunk += b"\n"
        text = latest_redraw(chunk.decode("utf-8", "replace").rstrip("\r\n"))
        is_ready_line = is_stdout and text.strip() == protocol.READY_LINE
        if is_ready_line:
            self.ready.set()
        if b"bind" in chunk or b"ddress" in chunk or b"gRPC server" in chunk:
            port = diagnosis.bind_failure(text)
            if port is not None and not self.bind_failure:
                self.bind_failure = port
        with self._lock:
            self._log.write(chunk)
            self.tail.append(diagnosis.TaskLine(text[:TAIL_LINE_CHARS], stderr=not is_stdout))
        if self._console is None or is_ready_line:  # the supervisor announces readiness once for all
            return
        if self._noise is not None and text.strip() and self._noise[is_stdout].is_noise(text):
            return  # a blank line is the program's own spacing: shown
        text = console_safe(text)  # after latest_redraw has taken the last state of a redrawn line
        bar = self._meter.render(text, len(self._prefix)) if is_stdout else None
        key = self._live_key(is_stdout)
        if bar is not None:
            progress = protocol.parse_progress(text)
            if progress[1] and progress[0] >= progress[1]:  # complete: stays where it ends, before later lines
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


class RunOutput:
    """Output of a whole run: the console and the run directory's log files."""

    def __init__(self, run_dir: RunDir, console: TextIO, timestamps: bool, show: frozenset[str] | None,
                 show_tf_logs: bool = False):
        self.run_dir = run_dir
        self._console = Console(console)
        self._timestamps = timestamps
        self._show = show
        self._show_tf_logs = show_tf_logs

    def shows(self, plan: TaskPlan) -> bool:
        return self._show is None or plan.type in self._show or plan.name in self._show

    def open_task(self, plan: TaskPlan, attempt: int) -> TaskOutput:
        console = self._console if self.shows(plan) else None
        log = os.fdopen(self.run_dir.open_log(log_name(plan)), "ab")
        return TaskOutput(plan, attempt, self.run_dir / log_name(plan), log, console, self._timestamps,
                          self._show_tf_logs)

    def notice(self, text: str) -> None:
        """A line from the launcher itself; always shown."""
        stamp = _clock() if self._timestamps else ""
        self._console.write_line(f"{stamp}{LAUNCHER_PREFIX}{text}\n", always=True)

    def close(self) -> None:
        self._console.close()
