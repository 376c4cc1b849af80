"""Who waits for whom: the task a synchronous job waits for.

In synchronous training every step ends with an exchange (a gradient all-reduce) that waits for
the slowest task: it computes while the others wait for it. So over the same minute the slow task
is busy for clearly more of the time than the others. A task's busy share comes from one of two
sources:

- its own time split: the MGPU_TIME_SPLIT lines it prints (protocol.py), milliseconds computing
  and waiting; busy = compute / (compute + wait). Exact, and the only right source for programs
  whose waits spin on a CPU (NCCL's busy polling) or that keep data-loader processes busy. Used
  when every task compared printed them over the window;
- else CPU samples of the task's processes: the time their threads were running or runnable
  (waiting for a CPU, or held back by a CPU quota: /proc's schedstat) over the wall time between
  two samples, summed over the task's processes and threads and capped at 100 %: a task whose
  threads together wanted a CPU all the time is busy, one whose threads slept (in a blocking
  receive) waits.

The rule: once every task compared has shares covering most of the last WINDOW seconds, a task
whose share is at least RATIO times the median of the others' and MARGIN above it is named, once
per run. An even cluster never is. Pure bookkeeping: the supervisor feeds it samples with the time
they were seen and asks; it never reads a clock.

Only training is judged (Training): start-up is no measure of pace. While one task compiles (a
DeepSpeed op built on one rank while the others wait on its lock), loads or downloads, the others
wait for it without any step to share, and the task busy then is not the one training will wait
for. So shares count from the moment every task compared is ready (its ready line, or it joined
the cluster) or reports its own progress, and training shows: a task reported progress (progress
or time-split lines), or the CPU samples are steady, every task at work (busy at least AT_WORK of
each interval, as a task of a synchronous job is in every step) for STEADY_SAMPLES samples running.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Mapping, Sequence

WINDOW = 60.0  # seconds of shares the rule compares
MIN_COVER = 0.8  # of WINDOW a task's samples must cover before it is compared
RATIO = 1.3  # the slow task's share over the median of the others'
MARGIN = 0.20  # and at least this much above it (20 points)
SAMPLE_INTERVAL = 2.0  # how often the supervisor samples each task's CPU use
# A task busy for less of an interval than this waits (on a lock, at a barrier, for a peer's compile):
# in a synchronous job's training every task computes its share of each step. A peer over twenty
# times slower than the rest keeps them below it too: such a job shows no start, and is never named.
AT_WORK = 0.05
STEADY_SAMPLES = 3  # consecutive samples with every task at work: training has begun

CPU = "cpu"
SPLIT = "split"


@dataclasses.dataclass(frozen=True)
class Slowest:
    task: str
    host: str
    share: float
    others: tuple[float, float]  # the lowest and highest share of the others
    source: str  # CPU or SPLIT
    window: float

    def text(self) -> str:
        low, high = (round(100 * share) for share in self.others)
        others = f"{low}%" if low == high else f"{low}-{high}%"
        seen = "its own time split" if self.source == SPLIT else "CPU samples"
        return (f"{self.task} on {self.host} is the slowest: busy {round(100 * self.share)}% of the last "
                f"{self.window:g} s, the others {others}: they wait for it ({seen})")

    def to_dict(self) -> dict:
        """`others`: the others' lowest and highest share, one value where they are the same (one other task)."""
        return {"task": self.task, "host": self.host, "busy": round(self.share, 3),
                "others": sorted({round(share, 3) for share in self.others}), "source": self.source,
                "window_s": self.window}


class _Series:
    """One task's intervals from one source: (seen at, busy seconds, wall seconds), oldest first."""

    def __init__(self):
        self.intervals: collections.deque[tuple[float, float, float]] = collections.deque()
        self.last: tuple[float, float] | None = None  # the previous cumulative sample (clock, busy)

    def add(self, seen: float, busy: float, wall: float) -> None:
        if wall > 0:
            self.intervals.append((seen, max(0.0, min(busy, wall)), wall))

    def share(self, now: float, window: float) -> tuple[float, float] | None:
        """(busy share, seconds covered) over the window ending at `now`; None without samples."""
        while self.intervals and self.intervals[0][0] <= now - window:
            self.intervals.popleft()
        wall = sum(interval[2] for interval in self.intervals)
        if wall <= 0:
            return None
        return sum(interval[1] for interval in self.intervals) / wall, wall


class Pace:
    """The busy shares of one attempt's training tasks, and the slowest of them once it shows."""

    def __init__(self, hosts: Mapping[str, str], window: float = WINDOW, named: set[str] | None = None):
        """`hosts`: the tasks to compare (the training tasks of a synchronous job), each with its host.
        `named`: the tasks already named in this run (shared between attempts: each is named once)."""
        self.hosts = dict(hosts)
        self.window = window
        self.named = named if named is not None else set()
        self._cpu = {name: _Series() for name in self.hosts}
        self._split = {name: _Series() for name in self.hosts}

    def cpu(self, name: str, at: float, runnable_seconds: float, now: float) -> None:
        """A CPU sample: the task's processes had been runnable (running or waiting for a CPU)
        for `runnable_seconds` in all at `at` on the sampler's own clock, seen at `now`. Processes
        or threads that end take their time with them: a drop counts as nothing done."""
        series = self._cpu.get(name)
        if series is None:
            return
        if series.last is not None and at > series.last[0]:
            series.add(now, runnable_seconds - series.last[1], at - series.last[0])
        if series.last is None or at > series.last[0]:
            series.last = (at, runnable_seconds)

    def split(self, name: str, compute_ms: int, wait_ms: int, now: float) -> None:
        """The task's own time split, cumulative: milliseconds computing and waiting in all."""
        series = self._split.get(name)
        if series is None:
            return
        if series.last is None:
            series.last = (0.0, 0.0)
        compute = compute_ms / 1000 - series.last[0]
        wait = wait_ms / 1000 - series.last[1]
        if compute >= 0 and wait >= 0 and compute + wait > 0:
            series.add(now, compute, compute + wait)
            series.last = (compute_ms / 1000, wait_ms / 1000)

    def _chosen(self, now: float) -> tuple[str, dict[str, tuple[float, float] | None]]:
        splits = {name: series.share(now, self.window) for name, series in self._split.items()}
        if all(splits.values()):
            return SPLIT, splits
        return CPU, {name: series.share(now, self.window) for name, series in self._cpu.items()}

    def shares(self, now: float) -> tuple[str, dict[str, float]]:
        """(source, each task's busy share over the window): the time splits where every task has
        one, else the CPU samples. Tasks without any are left out."""
        source, chosen = self._chosen(now)
        return source, {name: min(1.0, found[0]) for name, found in chosen.items() if found is not None}

    def slowest(self, now: float) -> Slowest | None:
        """The task the others wait for, the first time it shows (each task named once): every
        task's shares must cover most of the window."""
        source, chosen = self._chosen(now)
        if len(chosen) < 2 or not all(found and found[1] >= MIN_COVER * self.window for found in chosen.values()):
            return None
        shares = {name: min(1.0, found[0]) for name, found in chosen.items()}
        name = max(shares, key=shares.get)
        others = [share for other, share in shares.items() if other != name]
        median = statistics.median(others)
        share = shares[name]
        if name in self.named or share < RATIO * median or share - median < MARGIN:
            return None
        self.named.add(name)
        return Slowest(name, self.hosts[name], share, (min(others), max(others)), source, self.window)


@dataclasses.dataclass(frozen=True)
class Seen:
    """One look at a running task of the job."""

    ready: bool  # its ready line, or it joined the cluster
    progressed: bool = False  # it printed a progress line
    cpu: tuple[float, float] | None = None  # its CPU sample: (the sampler's clock, runnable seconds in all)
    split: tuple[int, int] | None = None  # its own time split in all: (compute ms, wait ms)


class Training:
    """The pace rule of one attempt (Pace), fed only once its training has begun."""

    def __init__(self, hosts: Mapping[str, str], window: float = WINDOW, named: set[str] | None = None):
        self.hosts = dict(hosts)
        self.window = window
        self.began: float | None = None  # when training was seen to begin
        self._pace = Pace(self.hosts, window, named)
        self._started: set[str] = set()  # ready, or reporting their own progress
        self._progressed = False
        self._last: dict[str, tuple[float, float]] = {}  # each task's previous CPU sample
        self._at_work = dict.fromkeys(self.hosts, 0)  # samples running in which it was at work

    def see(self, name: str, seen: Seen, now: float) -> None:
        """What the supervisor saw of task `name` at `now`."""
        if name not in self.hosts:
            return
        if self.began is None:
            self._before_training(name, seen, now)
        if self.began is not None:
            if seen.cpu is not None:
                self._pace.cpu(name, *seen.cpu, now)
            if seen.split is not None:
                self._pace.split(name, *seen.split, now)

    def _before_training(self, name: str, seen: Seen, now: float) -> None:
        progressed = seen.progressed or seen.split is not None
        started = seen.ready or progressed
        self._progressed |= progressed
        if started:
            self._started.add(name)
        if seen.cpu is not None:
            at, runnable = seen.cpu
            last = self._last.get(name)
            if last is None or at > last[0]:
                # A drop (a process that ended took its time with it: a compiler, a loader) is no work.
                at_work = last is not None and (runnable - last[1]) >= AT_WORK * (at - last[0])
                self._at_work[name] = self._at_work[name] + 1 if started and at_work else 0
                self._last[name] = seen.cpu
        steady = all(count >= STEADY_SAMPLES for count in self._at_work.values())
        if len(self._started) == len(self.hosts) and (self._progressed or steady):
            self.began = now

    def slowest(self, now: float) -> Slowest | None:
        return self._pace.slowest(now) if self.began is not None else None

    def shares(self, now: float) -> tuple[str, dict[str, float]]:
        return self._pace.shares(now) if self.began is not None else (CPU, {})


def compared(tasks: Sequence[tuple[str, str, str]], sidecar_types: frozenset[str],
             server_types: frozenset[str]) -> dict[str, str]:
    """The tasks the rule compares, name -> host, from (name, type, host): the training tasks of a
    synchronous job; none in parameter-server training, where workers do not wait for each other."""
    if server_types:
        return {}
    return {name: host for name, kind, host in tasks if kind not in sidecar_types}
