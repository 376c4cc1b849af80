"""Where a run's wall time went: on new steps, or lost, by cause (after Google's ml-goodput-measurement,
which splits "badput" the same way). Pure: fed the times an attempt started, reported its steps and
ended, it never reads a clock.

An attempt's time is cut at the moments its progress lines show:

    started ─ start_up ─▶ first step line ─ redone ─▶ back at the best step reached before
            ─ new steps ─▶ its last new step ─ after_last_step (a failure) or finish (an end) ─▶ ended

- start_up: from the attempt's start to its first step line, less that step's own work (estimated
  as the attempt's mean time between step lines); for the first attempt, from the supervisor's start.
- redone: time spent on steps at or below the best step any earlier attempt reached (work a restart
  does again, from its checkpoint), the first step's own work included when it is one of them.
- new_steps: time spent on steps above it. Goodput is new_steps over the run's wall time.
- after_last_step: a failed attempt's time from its last new step to its end (work not kept).
- stalled: of that, the time the stall watchdog saw no activity before it stopped the attempt.
- restart: between an attempt's end and the next one's start (the cause check, a fresh login, a
  spare's sync and setup and checks, the restart itself).
- finish: the attempt that ended the run, from its last step to its end (saving, exiting), and the
  supervisor's own end.

Without a step line an attempt cannot be split: a failed one is all start_up (or stalled), and one
that ended the run well is not counted; goodput is then unknown (None), not guessed.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from launcher.supervise.status import duration

CATEGORIES = ("start_up", "redone", "after_last_step", "stalled", "restart", "finish")


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """What an attempt's step lines showed, with the time (seconds, any one clock) each was seen."""
    first_at: float  # the first step line
    first_step: int
    caught_up_at: float | None  # the first line at or above the best step before the attempt; None: never
    last_new_at: float | None  # when the highest step, if above the best before, was first reached
    highest: int
    interval: float | None  # mean time between the lines that raised the step; None: one line only


@dataclasses.dataclass(frozen=True)
class AttemptTimes:
    started: float
    ended: float
    failed: bool  # its time after the last new step is lost (else it is the run's finish)
    best_before: int | None  # the highest step of any earlier attempt
    steps: StepTimes | None  # None: no step line
    stalled_for: float = 0.0  # a stall: how long the watchdog saw no activity before the stop
    restart_before: float = 0.0  # time between the previous attempt's end and this start


def attempt_split(a: AttemptTimes) -> dict[str, float]:
    """The attempt's seconds per category, and "new_steps"; they add up to its duration plus
    restart_before."""
    duration = max(0.0, a.ended - a.started)
    split = dict.fromkeys(CATEGORIES, 0.0)
    split["new_steps"] = 0.0
    split["restart"] = max(0.0, a.restart_before)
    s = a.steps
    if s is None:
        if a.failed:
            stalled = min(max(0.0, a.stalled_for), duration)
            split["stalled"], split["start_up"] = stalled, duration - stalled
        return split
    first = _clamp(s.first_at, a.started, a.ended)
    # The first line's own step was worked on before it: a mean step's time, taken off start-up.
    first_work = min(s.interval or 0.0, first - a.started)
    split["start_up"] = first - a.started - first_work
    best = a.best_before
    first_redone = best is not None and s.first_step <= best
    caught = a.ended if s.caught_up_at is None else _clamp(s.caught_up_at, first, a.ended)
    if best is None or s.first_step > best:
        caught = first
    split["redone"] = (caught - first) + (first_work if first_redone else 0.0)
    new_until = caught if s.last_new_at is None or best is not None and s.highest <= best else \
        _clamp(s.last_new_at, caught, a.ended)
    split["new_steps"] = (new_until - caught) + (0.0 if first_redone else first_work)
    tail = a.ended - new_until
    if a.failed:
        stalled = min(max(0.0, a.stalled_for), tail)
        split["stalled"], split["after_last_step"] = stalled, tail - stalled
    else:
        split["finish"] = tail
    return split


def run_split(attempts: Sequence[AttemptTimes], run_started: float, now: float) -> dict:
    """The run's seconds per category (the first attempt's start-up counts from `run_started`, the
    finish goes on to `now`), its wall time, the time lost and the goodput (None without steps)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    new = 0.0
    for a in attempts:
        for name, seconds in attempt_split(a).items():
            if name == "new_steps":
                new += seconds
            else:
                totals[name] += seconds
    if attempts:
        totals["start_up"] += max(0.0, attempts[0].started - run_started)
        totals["finish"] += max(0.0, now - attempts[-1].ended)
    wall = max(0.0, now - run_started)
    stepped = any(a.steps is not None for a in attempts)
    lost = sum(totals.values())
    return {
        "wall_s": round(wall, 3),
        "time_lost_s": round(lost, 3),
        "new_steps_s": round(new, 3) if stepped else None,
        "lost_s": {name: round(seconds, 3) for name, seconds in totals.items()},
        "goodput": (round(new / wall, 4) if wall > 0 else None) if stepped else None,
    }


def attempt_record(split: dict[str, float]) -> dict:
    """An attempt's figures as run.json keeps them: time_lost_s and new_steps_s, which add up to its
    duration, lost_s by cause, and restart_before_s, the time between the previous attempt and it
    (the run's, in its costs; not the attempt's own)."""
    own = [name for name in CATEGORIES if name != "restart"]
    return {"time_lost_s": round(sum(split[name] for name in own), 3), "new_steps_s": round(split["new_steps"], 3),
            "lost_s": {name: round(split[name], 3) for name in own}, "restart_before_s": round(split["restart"], 3)}


def told(costs: dict) -> str:
    """The costs in a few words, as the closing line and `mgpu status` say them: 'goodput 71%;
    4.1 s lost: 1.2 s start-up, 2.9 s redone'. Reads run.json's costs, which may be anyone's: each
    figure is used only if it is a number."""
    lost = _number(costs.get("time_lost_s"))
    goodput = _number(costs.get("goodput"))
    head = "goodput unknown (no steps reported)" if goodput is None else f"goodput {100 * goodput:.0f}%"
    by_cause = costs.get("lost_s") if isinstance(costs.get("lost_s"), dict) else {}
    parts = [f"{_seconds(_number(by_cause.get(name)))} {name.replace('_', '-')}" for name in CATEGORIES
             if (_number(by_cause.get(name)) or 0.0) >= 0.05]
    if lost is None:
        return head
    return f"{head}; {_seconds(lost)} lost" + (f": {', '.join(parts)}" if parts else "")


def _seconds(seconds: float | None) -> str:
    return duration(seconds or 0.0)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value and abs(value) < 1e12 else None


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)
