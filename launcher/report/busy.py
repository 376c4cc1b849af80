"""Each task's busy share over the run, from the run's samples (samples.jsonl, read by
supervise/samples.read): pure, the samples in, a row of cells per task out.

A sample holds each training task's busy share at its time; it stands for the time until the next
sample (the last one for SAMPLE_INTERVAL), so older samples, which the file keeps coarser, make
wider cells. A row holds at most `columns` cells: where there are more samples, consecutive ones
are merged into one cell, the share their mean weighted by the time each stands for. The samples
are anyone's text: a time or share that is not a finite number in range is skipped.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from launcher.supervise.samples import SAMPLE_INTERVAL

MAX_CELLS = 40_000  # cells of the whole picture: a run of 1,000 tasks gets 40 a row
MAX_COLUMNS = 400
MIN_COLUMNS = 10


@dataclasses.dataclass(frozen=True)
class Cell:
    start: float  # seconds since the run's start
    end: float
    share: float  # 0..1


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def columns_for(tasks: int) -> int:
    return max(MIN_COLUMNS, min(MAX_COLUMNS, MAX_CELLS // max(1, tasks)))


def rows(samples: Sequence[Any], start: float | None, tasks: Sequence[str]) -> tuple[tuple[str, tuple[Cell, ...]], ...]:
    """Each of `tasks` with its busy share over time, from `samples` (dicts with `at`, seconds since
    the epoch, and `busy`, task -> share); () where no sample has a share of any of them."""
    if start is None:
        return ()
    wanted = set(tasks)
    points: list[tuple[float, dict[str, float]]] = []
    for sample in samples:
        if not isinstance(sample, dict) or not isinstance(sample.get("busy"), dict):
            continue
        at = _number(sample.get("at"))
        if at is None or at < start:
            continue
        shares = {}
        for name, value in sample["busy"].items():
            share = _number(value)
            if name in wanted and share is not None and 0.0 <= share <= 1.0:
                shares[name] = share
        points.append((at - start, shares))
    points.sort(key=lambda point: point[0])
    if not any(shares for _, shares in points):
        return ()
    # Each sample stands for the time until the next one.
    spans = [(t, points[i + 1][0] if i + 1 < len(points) else t + SAMPLE_INTERVAL, shares)
             for i, (t, shares) in enumerate(points)]
    per_cell = math.ceil(len(spans) / columns_for(len(tasks)))
    drawn = []
    for name in tasks:
        cells = []
        for first in range(0, len(spans), per_cell):
            group = [(end - t, shares[name]) for t, end, shares in spans[first:first + per_cell] if name in shares]
            if not group:
                continue
            weight = sum(w for w, _ in group)
            share = sum(w * s for w, s in group) / weight if weight > 0 else sum(s for _, s in group) / len(group)
            cells.append(Cell(spans[first][0], spans[min(first + per_cell, len(spans)) - 1][1], share))
        drawn.append((name, tuple(cells)))
    return tuple(drawn)
