"""The run's samples over time (samples.jsonl in the run folder): every SAMPLE_INTERVAL seconds, the
hosts in use, each task's step and busy share, the steps per second, the goodput and the time lost by
cause so far. They feed the TensorBoard event files (tensorboard.py, with --tensorboard) and whatever
draws the run later.

Bounded for a run of weeks: at MAX_SAMPLES lines the file is written again downsampled by age
(`downsampled`: each doubling of age keeps about as many samples), so recent samples stay fine and
old ones get coarser, the run's first still there, and the file never holds more than MAX_SAMPLES
lines of at most MAX_LINE_BYTES. Each sample is one
write of one line, synced, so a crash loses at most the last interval; a write that fails (a full
disk) is said once and the samples after it are dropped until one can be written again, the file
keeping whole lines (a line left cut short is ended before the next, and readers skip it). The
rewrite goes to a new file that replaces the old one whole, or not at all.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import threading
from typing import Callable

from launcher.supervise.rundir import RunDir

NAME = "samples.jsonl"
SAMPLE_INTERVAL = 2.0  # seconds between two samples, as the busy shares are sampled (pace.py)
MAX_SAMPLES = 4096  # lines kept: the last 2 hours or so at full resolution, older ones coarser
EVENTS_OPEN_TIMEOUT = 60.0  # at the run's end, how long to wait for the event writer still being made
MAX_WAITING = 1000  # samples and restarts kept for the event writer until it is ready
MAX_LINE_BYTES = 16384  # a sample longer than this (thousands of tasks) keeps its run-wide figures only


def downsampled(lines: list[tuple[float, str]], limit: int, interval: float = SAMPLE_INTERVAL) -> list[tuple[float, str]]:
    """(time, line) pairs, oldest first, thinned by age: of the samples in a bucket the first is
    kept, a bucket being `interval` wide for the newest `per_octave` intervals, twice that for the
    next twice as long, and so on, so each doubling of age keeps about `per_octave` samples. Starts
    at limit / 16 per octave (256 of 4096: four weeks at 2 s keep about 3,300 lines), fewer where
    that leaves more than three quarters of `limit`, so the next samples have room."""
    if not lines:
        return []
    now = lines[-1][0]
    per_octave = max(1, limit // 16)
    while True:
        kept: dict[tuple[float, int], tuple[float, str]] = {}
        for at, line in lines:
            width = interval * 2 ** int(math.log2(1 + max(0.0, now - at) / (interval * per_octave)))
            kept.setdefault((width, math.floor(at / width)), (at, line))
        if len(kept) <= limit * 3 // 4 or per_octave == 1:
            return sorted(kept.values(), key=lambda pair: pair[0])[-limit:]
        per_octave //= 2


class SampleFile:
    """samples.jsonl of one run, appended to through the run folder's descriptor."""

    def __init__(self, run_dir: RunDir, report: Callable[[str], None], max_samples: int = MAX_SAMPLES):
        self._run_dir = run_dir
        self._report = report
        self._max = max_samples
        self._lines: list[tuple[float, str]] = []  # what the file holds (time, line), to write it again downsampled
        self._cut = False  # the last write may have left a line cut short
        self._reported = False
        self._fd: int | None = None
        try:
            self._fd = run_dir.create(NAME, append=True)
        except OSError as e:
            self._failed(e)

    def add(self, sample: dict) -> None:
        line = json.dumps(sample, separators=(",", ":"), allow_nan=False)
        if len(line) > MAX_LINE_BYTES:
            line = json.dumps({k: v for k, v in sample.items() if not isinstance(v, dict)}, separators=(",", ":"))
        if len(self._lines) >= self._max:
            self._rewrite(downsampled(self._lines, self._max))
        self._append(float(sample.get("at", 0.0)), line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, at: float, line: str) -> None:
        if self._fd is None:
            return
        data = (("\n" if self._cut else "") + line + "\n").encode()
        try:
            written = os.write(self._fd, data)
            self._cut = written != len(data)
            if not self._cut:
                os.fsync(self._fd)
                self._lines.append((at, line))
        except OSError as e:
            self._cut = True
            self._failed(e)

    def _rewrite(self, lines: list[tuple[float, str]]) -> None:
        tmp = NAME + ".tmp"
        try:
            self._run_dir.unlink(tmp)
            fd = self._run_dir.create(tmp)
            try:
                data = "".join(line + "\n" for _, line in lines).encode()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            self._run_dir.replace(tmp, NAME)
        except OSError as e:
            try:
                self._run_dir.unlink(tmp)  # gives its space back
            except OSError:
                pass
            self._failed(e)
            self._lines = lines  # kept in memory: the next rewrite tries again
            return
        self.close()
        self._fd = os.open(NAME, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._run_dir.fd)
        self._lines, self._cut = lines, False

    def _failed(self, error: OSError) -> None:
        if not self._reported:
            self._reported = True
            self._report(f"cannot write {NAME} in {self._run_dir.path}: {error.strerror or error}; "
                         f"samples are dropped until it can be written again")


def read(text: str, max_lines: int = 2 * MAX_SAMPLES) -> list[dict]:
    """The samples of a samples.jsonl's text, which may be anyone's: lines that are not a JSON
    object (one cut short by a crash or a full disk) are skipped; at most `max_lines` are read."""
    samples = []
    for line in text.splitlines()[-max_lines:]:
        if len(line) > MAX_LINE_BYTES:
            continue
        try:
            sample = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(sample, dict):
            samples.append(sample)
    return samples


class RunSamples:
    """What the supervisor samples every SAMPLE_INTERVAL: into samples.jsonl, and with --tensorboard
    into TensorBoard's event files too. tensorboardX is imported on a thread of its own (seconds, on
    a loaded machine), so the tasks start meanwhile; what comes before it is ready waits for it."""

    def __init__(self, run_dir: RunDir, tensorboard: pathlib.Path | None, started: float,
                 report: Callable[[str], None]):
        self._report = report
        self._events = None
        self._waiting: list[tuple[str, tuple]] | None = None  # calls made before the writer was ready
        self._thread: threading.Thread | None = None
        if tensorboard is not None:  # tensorboardX only for a run that asked for it
            self._waiting = []
            self._thread = threading.Thread(target=self._open_events, args=(tensorboard, started),
                                            name="mgpu-tensorboard", daemon=True)
            self._thread.start()
        self.file = SampleFile(run_dir, report)
        self._next = 0.0
        self._last: tuple[float, int, int] | None = None  # (when, attempt, highest step) of the last sample
        self._lock = threading.Lock()

    def due(self, now: float) -> bool:
        return now >= self._next

    def take(self, now: float, attempt: int, steps: dict[str, int | None], hosts: int,
             busy: dict[str, float], costs: dict) -> None:
        """A sample at `now` (seconds since the epoch): the attempt's number, each task's step, the
        hosts in use, each task's busy share, the run's costs so far."""
        self._next = now + SAMPLE_INTERVAL
        highest = max((s for s in steps.values() if s is not None), default=None)
        rate = None
        if highest is not None and self._last is not None and self._last[1] == attempt and now > self._last[0]:
            rate = round(max(0, highest - self._last[2]) / (now - self._last[0]), 3)
        self._last = (now, attempt, highest) if highest is not None else None
        sample = {"at": round(now, 3), "attempt": attempt, "hosts": hosts, "steps": steps, "steps_per_s": rate,
                  "busy": busy, "costs": {k: costs.get(k) for k in ("goodput", "time_lost_s", "lost_s", "restarts")}}
        self.file.add(sample)
        self._to_events("sample", (sample,))

    def restart(self, number: int, at: float, cause: dict) -> None:
        self._to_events("restart", (number, at, str(cause.get("cause")), cause.get("task"), cause.get("host"),
                                    str(cause.get("detail") or "")))

    def close(self) -> None:
        self.file.close()
        if self._thread is not None:
            self._thread.join(EVENTS_OPEN_TIMEOUT)
        with self._lock:
            if self._events is not None:
                self._events.close()
            self._events, self._waiting = None, None

    def _to_events(self, method: str, args: tuple) -> None:
        with self._lock:
            if self._events is not None:
                try:
                    getattr(self._events, method)(*args)
                except Exception as e:  # noqa: BLE001 - the run goes on without its event files
                    self._report(f"cannot write TensorBoard event files in {self._events.path}: {e}; "
                                 f"no more are written")
                    events, self._events = self._events, None
                    try:
                        events.close()
                    except Exception:  # noqa: BLE001
                        pass
            elif self._waiting is not None and len(self._waiting) < MAX_WAITING:
                self._waiting.append((method, args))

    def _open_events(self, folder: pathlib.Path, started: float) -> None:
        try:
            from launcher.supervise.tensorboard import EventWriter
            events = EventWriter(folder, started)
        except Exception as e:  # noqa: BLE001 - the run goes on without its event files
            self._report(f"cannot write TensorBoard event files in {folder}: {e}")
            with self._lock:
                self._waiting = None
            return
        with self._lock:
            if self._waiting is None:  # closed meanwhile
                events.close()
                return
            for method, args in self._waiting:
                getattr(events, method)(*args)
            self._events, self._waiting = events, None
