"""Task output: the per-task log files and the prefixed console view.

Each of a task's two streams has a reader (stream_reader.py) that drains it to its end, so
a task never blocks on a full pipe, whatever it prints. Every byte goes, exactly as read, to
<run dir>/<type>-<index>.log, in whole lines so that the two streams' lines never mix
(task_log.py); after a restart the same file continues below a
"----- mgpu: attempt N started <time> (MGPU_ATTEMPT=N-1) -----" line. Every line also goes to the task's
watchers (watchers.py): the ready line, bind failures, the tail kept for the failure
summary, and the console view. A watcher that fails is reported once and never stops the
reader or the log.

The console gets each line prefixed with the task's name ("[worker:1] "), optionally with a
time, and only for the tasks `show` selects; a line longer than 64 KiB is shown in pieces.
TensorFlow's C++ chatter (diagnosis.is_noise: INFO and WARNING records, the notices every
GPU-less start prints) stays off the console unless asked for. Console lines wait in a
bounded buffer written by one thread; if the console cannot keep up (a paused pager, a slow
terminal), task lines are dropped from the console, never from the log, and a notice says
how many. The launcher's own lines are never dropped: closing waits until they are written.

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
from typing import BinaryIO, Callable, Sequence, TextIO

from launcher.supervise import diagnosis
from launcher.plan.planner import TaskPlan
from launcher.supervise.live import LiveLines
from launcher.supervise.rundir import RunDir
from launcher.supervise.stream_reader import PIECE, read_stream
from launcher.supervise.task_log import TaskLog
from launcher.supervise.watchers import (BindFailureWatcher, CheckpointWatcher, ConsoleWatcher, LineWatcher, ProgressWatcher,
                                         ReadyWatcher, TailWatcher, TimeSplitWatcher, Watchers)

CHUNK = PIECE  # a longer line reaches the console in pieces
TAIL_LINES = 500  # kept per task for the failure summary, which finds the cause in them
CONSOLE_BUFFER_CHARS = 8 * 1024 * 1024
LAUNCHER_PREFIX = "[mgpu] "


def log_name(plan: TaskPlan) -> str:
    return f"{plan.type}-{plan.index}.log"


def _clock() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3] + " "


def _no_clock() -> str:
    return ""


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

    def redirect(self, stream: TextIO) -> None:
        """Go on writing to `stream` (a file: lines redrawn in place become plain lines), e.g. when
        the terminal is gone. Also revives a console that its old stream had broken."""
        with self._cond:
            self._stream = stream
            self.terminal = False
            self.width = 0
            live = LiveLines(False)
            for key, text in self._live.pending().items():
                live.update(key, text)
            self._live = live
            revive = self._broken and not self._closing
            self._broken = False
            self._cond.notify()
        if revive:
            self._thread = threading.Thread(target=self._run, name="mgpu-console", daemon=True)
            self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued and stop the writer thread. Waits as long as the console takes
        (a pipe read late, a paused pager), unless `timeout` is given: the launcher's own lines,
        its closing line among them, are written before it exits, or the console is gone."""
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
            with self._cond:
                stream = self._stream
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):  # console closed (a pipe reader went away): keep running without it
                with self._cond:
                    if stream is not self._stream:  # redirected meanwhile (the terminal hung up): go on there
                        continue
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
        notice: Callable[[str], None] | None = None,
        watchers: Sequence[LineWatcher] = (),
        after_partial_line: bool = False,
        prefix: str | None = None,
    ):
        """`notice` reports the launcher's own troubles (a failing watcher, a full disk);
        `watchers` see every line after the built-in ones; `after_partial_line`: the log's
        previous attempt ended in the middle of a line; `prefix`: what comes before each of its
        lines on the console (by default "[TYPE:INDEX] ")."""
        self.plan = plan
        self.log_path = log_path
        self.tail: collections.deque[diagnosis.TaskLine] = collections.deque(maxlen=TAIL_LINES)
        self.ready = threading.Event()
        self.last_activity = time.monotonic()  # of the last bytes read from either stream
        report = notice or (lambda text: None)
        self._log = TaskLog(log, report, plan.name)  # log: opened in the run dir by RunOutput
        self._bind = BindFailureWatcher()
        self.progress = ProgressWatcher(time.monotonic)  # the last line and progress, for run.json
        self.time_split = TimeSplitWatcher()  # the task's own compute/wait split, for the pace rule
        self.checkpoints = CheckpointWatcher()  # the checkpoints it said it saved, for taking a host back
        builtin: list[LineWatcher] = [ReadyWatcher(self.ready), self._bind, TailWatcher(self.tail), self.progress,
                                      self.checkpoints, self.time_split]
        self._console_view = None
        if console is not None:
            self._console_view = ConsoleWatcher(console, prefix or f"[{plan.name}] ",
                                                _clock if timestamps else _no_clock, show_tf_logs)
            builtin.append(self._console_view)
        self._watchers = Watchers([*builtin, *watchers], report, plan.name)
        self._threads: list[threading.Thread] = []
        if attempt > 0:
            started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            # Counted as the console counts attempts, from 1; the program sees MGPU_ATTEMPT, from 0.
            header = f"----- mgpu: attempt {attempt + 1} started {started} (MGPU_ATTEMPT={attempt}) -----\n"
            self._log.write_own((("\n" if after_partial_line else "") + header).encode())

    @property
    def bind_failure(self) -> int | None:
        """The port a "could not bind" message named (0: unnamed); None when there was none."""
        return self._bind.port

    @property
    def log_ends_mid_line(self) -> bool:
        return self._log.ends_mid_line

    def attach(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        """Start draining the task's two streams."""
        for stream, is_stdout in ((stdout, True), (stderr, False)):
            thread = threading.Thread(
                target=read_stream,
                args=(stream, is_stdout, self._log, self._watchers, self._active),
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

    def mute_console(self) -> None:
        """Keep what the task prints from now on off the console (the log still gets it): the
        stacks a stalled task dumps, which the stall report sums up."""
        if self._console_view is not None:
            self._console_view.muted = True

    def flush(self) -> None:
        self._log.flush()

    def close(self) -> None:
        self._log.close()
        self._watchers.close()

    def _active(self) -> None:
        self.last_activity = time.monotonic()


class RunOutput:
    """Output of a whole run: the console and the run directory's log files."""

    def __init__(self, run_dir: RunDir, console: TextIO, timestamps: bool, show: frozenset[str] | None,
                 show_tf_logs: bool = False):
        self.run_dir = run_dir
        self._console = Console(console)
        self._timestamps = timestamps
        self._show = show
        self._show_tf_logs = show_tf_logs
        self._last: dict[str, TaskOutput] = {}  # by log name: the latest attempt's output
        self.best_step: int | None = None  # the highest step of the attempts so far: what a restart redoes

    def shows(self, plan: TaskPlan) -> bool:
        return self._show is None or plan.type in self._show or plan.name in self._show

    def open_task(self, plan: TaskPlan, attempt: int) -> TaskOutput:
        console = self._console if self.shows(plan) else None
        name = log_name(plan)
        log = os.fdopen(self.run_dir.open_log(name), "ab")
        previous = self._last.get(name)
        output = TaskOutput(plan, attempt, self.run_dir / name, log, console, self._timestamps, self._show_tf_logs,
                            notice=self.notice, after_partial_line=previous is not None and previous.log_ends_mid_line)
        output.progress.resume_step = self.best_step  # before its streams are attached: before any line
        self._last[name] = output
        return output

    def notice(self, text: str) -> None:
        """A line from the launcher itself; always shown."""
        stamp = _clock() if self._timestamps else ""
        self._console.write_line(f"{stamp}{LAUNCHER_PREFIX}{text}\n", always=True)

    def redirect_console(self, stream: TextIO) -> None:
        """The console goes on in `stream` (console.log, when there is no terminal any more)."""
        self._console.redirect(stream)

    def close(self) -> None:
        self._console.close()
