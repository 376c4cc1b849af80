"""Where the run's time went, as the report shows it: run.json's `costs.lost_s` and each attempt's
`lost_s` as one table, a row per cause (named as docs/output.md names them) and a column for the run
and for each attempt, the new steps' time and the time lost below. Pure; the figures are anyone's:
one that is not a finite number shows as '-'."""

from __future__ import annotations

import math
from typing import Any, Sequence

from launcher.supervise.lost_time import CATEGORIES

# What each cause counts, in docs/output.md's words.
COUNTS = {
    "start_up": "launch to the first step",
    "redone": "steps at or below the best step reached before",
    "after_last_step": "a failed attempt after its last new step",
    "stalled": "a stall before the stop",
    "restart": "between attempts",
    "finish": "the end: the last step line to the end",
}
MAX_ATTEMPT_COLUMNS = 20  # the others are in the attempts' table


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 <= value < 1e12 else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def split(costs: dict) -> tuple[tuple[str, float], ...]:
    """The run's new steps' time and each cause's, in seconds (those that are numbers)."""
    by_cause = costs.get("lost_s") if isinstance(costs.get("lost_s"), dict) else {}
    parts = [("new steps", _seconds(costs.get("new_steps_s")))]
    parts += [(name, _seconds(by_cause.get(name))) for name in CATEGORIES]
    return tuple((name, seconds) for name, seconds in parts if seconds is not None)


def table(costs: dict, attempts: Sequence[tuple[str, dict]]
          ) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]] | None:
    """(columns, rows) of the time lost by cause, for the run and each (name, attempt record);
    None where the record splits no time lost."""
    run = costs.get("lost_s") if isinstance(costs.get("lost_s"), dict) else None
    shown = [(name, a) for name, a in attempts if isinstance(a.get("lost_s"), dict)][:MAX_ATTEMPT_COLUMNS]
    if run is None and not shown:
        return None
    wall = _seconds(costs.get("wall_s"))
    columns = ("cause", "what it counts", "run", "share of the wall time", *(name for name, _ in shown))
    rows = []
    for cause in CATEGORIES:
        seconds = _seconds((run or {}).get(cause))
        share = f"{100 * seconds / wall:.1f}%" if seconds is not None and wall else "-"
        per_attempt = []
        for _, a in shown:
            value = a.get("restart_before_s") if cause == "restart" else a["lost_s"].get(cause)
            per_attempt.append(_shown(_seconds(value)))
        rows.append((cause, COUNTS[cause], _shown(seconds), share, *per_attempt))
    for label, field in (("time lost", "time_lost_s"), ("new steps", "new_steps_s")):
        seconds = _seconds(costs.get(field))
        share = f"{100 * seconds / wall:.1f}%" if seconds is not None and wall else "-"
        rows.append((label, "all of the above" if field == "time_lost_s" else "steps above the best reached before",
                     _shown(seconds), share, *(_shown(_seconds(a.get(field))) for _, a in shown)))
    return columns, tuple(rows)
