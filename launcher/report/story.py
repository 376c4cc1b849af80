"""A run's record as what the report shows: pure (a dict in, a Story out, no I/O).

run.json is anyone's text: each value is taken only if it has the type the report expects (else it
is left out, never guessed), texts are cut to MAX_TEXT characters, numbers must be finite, and at
most MAX_TASKS tasks and MAX_ATTEMPTS attempts are drawn (the rest counted, not shown). Times are
seconds since the run's start. Fields of `costs` and of each attempt that this module does not know
(a breakdown of the time lost, say) are kept as they are, flattened one level, to be shown as
tables, so a record with more or fewer figures is shown without failing.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import shlex
from typing import Any, Sequence

from launcher.report import lost as lost_time
from launcher.report.busy import Cell, rows as busy_rows

MAX_TEXT = 2000  # characters of any one text shown (a failure's detail, a command)
MAX_TASKS = 1000
MAX_ATTEMPTS = 500
MAX_COLUMNS = 24  # of a table of figures the report does not know
MAX_ROWS = 200
MAX_TIME_TEXT = 64

# The fields of an attempt that the timeline and the restarts show; the others are its figures.
_ATTEMPT_SHOWN = {"attempt", "started_at", "ended_at", "outcome", "tasks", "ready_at", "slowest", "cause", "task",
                  "host", "detail", "progress", "flight_recorder"}
_COSTS_SHOWN = {"left_out"}
# A log the page links to is a plain file of the run's folder, named as a launch names them.
_LOG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,199}")


@dataclasses.dataclass(frozen=True)
class Bar:
    """One task's part in one attempt: its start, when it was ready, its end (None: not known)."""
    task: str
    attempt: int
    host: str
    start: float
    ready: float | None
    end: float | None
    state: str  # "exit 0", "SIGTERM", "running"
    ok: bool  # exited 0
    at_fault: bool  # the task the attempt's failure was charged to
    busy: float | None  # its last busy share in the attempt (0..1)
    progress: str  # "step 6/6", or ""


@dataclasses.dataclass(frozen=True)
class Restart:
    attempt: int  # the attempt that failed
    at: float | None
    cause: str
    task: str
    host: str
    detail: str


@dataclasses.dataclass(frozen=True)
class LeftOut:
    host: str
    cause: str
    at: float | None
    replaced_by: str


@dataclasses.dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class Stall:
    """A stalled attempt: its evidence folder in the run's (stall-<attempt>, as the supervisor names
    it) and the flight recorder's verdict, one line per collective not joined."""
    attempt: int
    folder: str
    verdict: tuple[str, ...] = ()


def _counted(number_: Any) -> Any:
    """An attempt's number as people are told it (the console, notices: from 1); run.json's counts from 0."""
    return number_ + 1 if isinstance(number_, int) and not isinstance(number_, bool) else number_


def _stall(number_: Any, attempt: dict) -> Stall | None:
    if attempt.get("outcome") != "stalled" or not isinstance(number_, int) or isinstance(number_, bool) \
            or not 0 <= number_ < 10**6:
        return None
    verdict = []
    for missing in _list(_dict(attempt.get("flight_recorder")).get("missing"))[:16]:
        if isinstance(missing, dict):
            tasks = ", ".join(text(t, 200) for t in _list(missing.get("tasks"))[:64])
            verdict.append(f"{tasks} did not join {text(missing.get('collective'), 120)} #{text(missing.get('sequence'), 20)}")
    return Stall(number_ + 1, f"stall-{number_}", tuple(verdict))  # the console's count; the folder's name is run.json's


@dataclasses.dataclass(frozen=True)
class Story:
    run_id: str
    status: str
    message: str
    started_at: str
    ended_at: str
    wall: float  # seconds from the run's start to its end (or its last event)
    commands: tuple[str, ...]  # the tasks' distinct command lines
    hosts: Table  # host, tasks, address, GPUs
    settings: Table
    tasks: tuple[str, ...]
    bars: tuple[Bar, ...]
    attempt_starts: tuple[tuple[int, float], ...]
    restarts: tuple[Restart, ...]
    left_out: tuple[LeftOut, ...]
    goodput: float | None
    costs: Table  # the scalar figures of `costs`
    breakdowns: tuple[tuple[str, Table], ...]  # each dict or list of `costs`, as a table
    attempts: Table  # each attempt's figures (progress, time lost, whatever else it records)
    checks: Table | None  # the host checks' table, where the run's folder holds one
    logs: tuple[tuple[str, str], ...]  # (task, log file name)
    left: tuple[str, ...]  # what was not drawn ("1200 tasks: the first 1000 drawn")
    stalls: tuple[Stall, ...] = ()  # the stalled attempts, whose folder the page links
    busy_over_time: tuple[tuple[str, tuple[Cell, ...]], ...] = ()  # each task's, from samples.jsonl
    launched_with: str = ""  # the `mgpu launch` command line, its secrets hidden by the launch
    lost: Table | None = None  # the time lost by cause, for the run and each attempt (lost.py)
    time_split: tuple[tuple[str, float], ...] = ()  # the run's new steps' time and each cause's, in seconds


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """A value of the record as text, cut to `limit` characters ('' for null)."""
    if value is None:
        return ""
    if isinstance(value, float):
        value = f"{value:.6g}"
    value = str(value) if isinstance(value, (str, int, bool)) else ""
    return value if len(value) <= limit else value[:limit - 1] + "…"


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) < 1e15 else None


def epoch(value: Any) -> float | None:
    """An ISO 8601 time of the record as seconds since the epoch (None if it is not one)."""
    if not isinstance(value, str) or len(value) > MAX_TIME_TEXT:
        return None
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    try:
        return when.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _figure(value: Any) -> str | None:
    """A scalar figure (or a short list of them) as text; None for what is not one."""
    if value is None or isinstance(value, (str, bool)):
        return text(value, 200) if value is not None else "-"
    if number(value) is not None:
        return text(value)
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value[:MAX_ROWS]):
        return text("; ".join(text(item, 200) for item in value[:MAX_ROWS]), MAX_TEXT)
    return None


def _flat(fields: dict, skip: set[str] = frozenset()) -> dict[str, str]:
    """The scalar fields of a dict, and those of its dicts as 'name.field', as text."""
    flat: dict[str, str] = {}
    for name, value in list(fields.items())[:MAX_COLUMNS * 4]:
        if name in skip or not isinstance(name, str):
            continue
        if isinstance(value, dict):
            for inner, item in list(value.items())[:MAX_COLUMNS]:
                shown = _figure(item)
                if shown is not None:
                    flat[f"{text(name, 60)}.{text(inner, 60)}"] = shown
        elif (shown := _figure(value)) is not None:
            flat[text(name, 60)] = shown
    return flat


def _table_of(rows: list[dict[str, str]], first: tuple[str, ...] = ()) -> Table:
    columns = list(first)
    for row in rows:
        columns.extend(name for name in row if name not in columns)
    columns = columns[:MAX_COLUMNS]
    return Table(tuple(columns), tuple(tuple(row.get(c, "") for c in columns) for row in rows[:MAX_ROWS]))


def breakdown(name: str, value: Any) -> Table | None:
    """A figure of `costs` that is not a scalar, as a table: a dict of scalars as (field, value) rows;
    a dict of dicts or a list of dicts as one row each."""
    if isinstance(value, dict):
        if all(_figure(item) is not None for item in value.values()):
            return Table(("", text(name, 60)), tuple((text(k, 60), _figure(v) or "") for k, v in
                                                     list(value.items())[:MAX_ROWS]))
        rows = [{"": text(key, 60), **_flat(item)} for key, item in list(value.items())[:MAX_ROWS]
                if isinstance(item, dict)]
        return _table_of(rows, ("",)) if rows else None
    if isinstance(value, list):
        rows = [_flat(item) for item in value[:MAX_ROWS] if isinstance(item, dict)]
        return _table_of(rows) if rows else None
    return None


def _since(start: float | None, value: Any) -> float | None:
    when = epoch(value)
    return None if when is None or start is None else max(0.0, when - start)


def _state(task: dict) -> tuple[str, bool]:
    if task.get("ended_at") is None:
        return "running", False
    if isinstance(task.get("signal"), str):
        return text(task["signal"], 40), False
    code = task.get("exit_code")
    return (f"exit {code}" if isinstance(code, int) and not isinstance(code, bool) else "ended"), code == 0


def _progress(task: dict) -> str:
    progress = _dict(task.get("progress"))
    step, total = number(progress.get("step")), number(progress.get("total"))
    if step is None:
        return ""
    return f"step {step:g}" + (f"/{total:g}" if total else "")


def _plans(record: dict) -> list[dict]:
    return [plan for plan in _list(record.get("plans"))[:MAX_TASKS * 2] if isinstance(plan, dict)]


def _task_name(plan: dict) -> str:
    name = plan.get("name")
    if isinstance(name, str):
        return text(name, 200)
    return f"{text(plan.get('type'), 100)}:{text(plan.get('index'), 20)}"


def _hosts(plans: list[dict], attempts: list[dict]) -> Table:
    """Each host's tasks, as planned and as they ran (a spare took a host's tasks in a later attempt)."""
    hosts: dict[str, dict[str, Any]] = {}
    for plan in plans:
        host = hosts.setdefault(text(plan.get("host"), 200), {"tasks": [], "address": set(), "gpus": set()})
        host["tasks"].append(_task_name(plan))
        host["address"].add(text(plan.get("address"), 200))
        host["gpus"].add(text(plan.get("gpus"), 200))
    for attempt in attempts:
        for name, task in list(_dict(attempt.get("tasks")).items())[:MAX_TASKS]:
            if isinstance(task, dict) and isinstance(task.get("host"), str) and len(hosts) < MAX_ROWS:
                host = hosts.setdefault(text(task["host"], 200), {"tasks": [], "address": set(), "gpus": set()})
                if text(name, 200) not in host["tasks"]:
                    host["tasks"].append(text(name, 200))
    return Table(("host", "tasks", "address", "GPUs"), tuple(
        (name, ", ".join(h["tasks"]), ", ".join(sorted(h["address"] - {""})), "; ".join(sorted(h["gpus"] - {""})))
        for name, h in list(hosts.items())[:MAX_ROWS]))


def _commands(plans: list[dict]) -> tuple[str, ...]:
    commands = []
    for plan in plans:
        argv = [text(arg, MAX_TEXT) for arg in _list(plan.get("argv"))[:200]]
        command = text(shlex.join(argv), MAX_TEXT) if argv else ""
        if command and command not in commands:
            commands.append(command)
    return tuple(commands[:20])


def _checks(record: dict) -> Table | None:
    rows = [_flat(row) for row in _list(record.get("checks"))[:MAX_ROWS] if isinstance(row, dict)]
    return _table_of(rows) if rows else None


def story(record: dict, checks: list | None = None, samples: Sequence[Any] = ()) -> Story:
    """What the report shows of `record` (run.json, read and shape-checked by run_files), the
    host checks' rows, where the run's folder holds them, and the run's samples (samples.jsonl)."""
    start = epoch(record.get("started_at"))
    plans = _plans(record)
    attempts = [a for a in _list(record.get("attempts")) if isinstance(a, dict)]
    left: list[str] = []
    if len(attempts) > MAX_ATTEMPTS:
        left.append(f"{len(attempts)} attempts: the first {MAX_ATTEMPTS // 2} and the last {MAX_ATTEMPTS // 2} drawn")
        attempts = attempts[:MAX_ATTEMPTS // 2] + attempts[-MAX_ATTEMPTS // 2:]
    names = [_task_name(plan) for plan in plans]
    for attempt in attempts:
        names.extend(text(name, 200) for name in _dict(attempt.get("tasks")) if text(name, 200) not in names)
    names = list(dict.fromkeys(names))
    if len(names) > MAX_TASKS:
        left.append(f"{len(names)} tasks: the first {MAX_TASKS} drawn")
        names = names[:MAX_TASKS]
    drawn = set(names)
    bars, starts, restarts, rows, stalls = [], [], [], [], []
    ends = [t for t in (_since(start, record.get("ended_at")),) if t is not None]
    for i, attempt in enumerate(attempts):
        number_ = attempt.get("attempt") if isinstance(attempt.get("attempt"), int) else i
        shown = _counted(number_)  # as the console counts attempts, from 1 (run.json counts from 0)
        begun = _since(start, attempt.get("started_at"))
        if begun is not None:
            starts.append((shown, begun))
        fault = text(attempt.get("task"), 200)
        for name, task in _dict(attempt.get("tasks")).items():
            name = text(name, 200)
            if name not in drawn or not isinstance(task, dict):
                continue
            task_start = _since(start, task.get("started_at"))
            if task_start is None:
                task_start = begun
            if task_start is None:
                continue
            end = _since(start, task.get("ended_at"))
            ends.extend(t for t in (end, task_start) if t is not None)
            state, ok = _state(task)
            bars.append(Bar(name, shown, text(task.get("host"), 200), task_start,
                            _since(start, task.get("ready_at")), end, state, ok,
                            bool(attempt.get("cause")) and name == fault,
                            number(_dict(task.get("busy")).get("share")), _progress(task)))
        if attempt.get("cause") is not None:
            restarts.append(Restart(shown, _since(start, attempt.get("ended_at")), text(attempt.get("cause"), 100),
                                    fault, text(attempt.get("host"), 200), text(attempt.get("detail"))))
        stall = _stall(number_, attempt)
        if stall is not None:
            stalls.append(stall)
        progress = _dict(attempt.get("progress"))
        rows.append({"attempt": text(shown), "outcome": text(attempt.get("outcome"), 100),
                     "last step": _figure(progress.get("last_step")) or "-",
                     "new steps": _figure(progress.get("gained")) or "-",
                     **_flat(attempt, _ATTEMPT_SHOWN)})
    costs = _dict(record.get("costs"))
    left_out = tuple(LeftOut(text(item.get("host"), 200), text(item.get("cause"), 100), _since(start, item.get("at")),
                             text(item.get("replaced_by"), 200))
                     for item in _list(costs.get("left_out"))[:MAX_ROWS] if isinstance(item, dict))
    scalars = {text(name, 60): shown for name, value in list(costs.items())[:MAX_ROWS]
               if name not in _COSTS_SHOWN and (shown := _figure(value)) is not None}
    breakdowns = tuple((text(name, 60), table) for name, value in list(costs.items())[:MAX_COLUMNS]
                       if name not in _COSTS_SHOWN and (table := breakdown(name, value)) is not None)
    goodput = number(costs.get("goodput"))
    logs = {}
    for attempt in attempts:
        for name, task in _dict(attempt.get("tasks")).items():
            log = isinstance(task, dict) and task.get("log")
            if isinstance(log, str) and _LOG_NAME.fullmatch(log) and text(name, 200) in drawn:
                logs.setdefault(text(name, 200), log)
    options = _dict(record.get("options"))
    settings = Table(("setting", "value"), tuple((text(k, 60), _figure(v) or "") for k, v in
                                                 list(options.items())[:MAX_ROWS] if k != "command_line"))
    given = [text(arg, MAX_TEXT) for arg in _list(options.get("command_line"))[:MAX_ROWS * 3]]
    return Story(
        run_id=text(record.get("run_id"), 200), status=text(record.get("status"), 100),
        message=text(record.get("message")), started_at=text(record.get("started_at"), MAX_TIME_TEXT),
        ended_at=text(record.get("ended_at"), MAX_TIME_TEXT), wall=max(ends, default=0.0),
        commands=_commands(plans), hosts=_hosts(plans, attempts), settings=settings, tasks=tuple(names), bars=tuple(bars),
        attempt_starts=tuple(starts), restarts=tuple(restarts), left_out=left_out,
        goodput=goodput if goodput is not None and 0 <= goodput <= 1 else None,
        costs=Table(("figure", "value"), tuple(scalars.items())), breakdowns=breakdowns,
        attempts=_table_of(rows, ("attempt", "outcome", "last step", "new steps")),
        checks=_checks({"checks": checks}) if checks is not None else _checks(record),
        logs=tuple(logs.items()), left=tuple(left), stalls=tuple(stalls),
        busy_over_time=busy_rows(samples, start, names),
        launched_with=text(shlex.join(given), MAX_TEXT * 4) if given else "",
        lost=Table(*lost_by_cause) if (lost_by_cause := lost_time.table(costs, [
            (f"attempt {text(_counted(a.get('attempt') if isinstance(a.get('attempt'), int) else i), 20)}", a)
            for i, a in enumerate(attempts)])) else None,
        time_split=lost_time.split(costs))
