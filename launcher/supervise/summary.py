"""What mgpu says at the end of a run: the failure summary, the start-timeout report, the closing line.

Pure text building from what the supervisor saw; what task output means comes from diagnosis.py.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

from launcher.supervise import diagnosis, stacks
from launcher.supervise.console_text import console_safe


@dataclasses.dataclass(frozen=True)
class TaskView:
    """One task as the summaries need it."""

    name: str
    host: str
    port: int | None
    waits_for_ready: bool  # speaks the ready-line protocol
    lines: Sequence[str]  # its last lines of output, this attempt
    log_path: pathlib.Path
    joined: bool | None = None  # whether it listened on its port (or dialled the coordinator's); None: unknown
    coordinator_port: int | None = None  # a connection to it counts as joining; None: only listening counts


def failure_summary(head: str, task: TaskView) -> str:
    """`head`, then why the task failed (exception and frame, first error line, or its last lines),
    known-failure hints, and where its log is."""
    lines = [head]
    title, shown = diagnosis.cause(task.lines)
    shown = [console_safe(line) for line in shown]  # task output may carry terminal control sequences
    if not shown:
        lines.append(f"no output (log: {task.log_path})")
    elif title.startswith("last "):
        lines.append(f"{title} of {task.log_path}:")
        lines.extend("  " + line for line in shown)
    else:
        lines.extend("  " + line for line in shown)
    lines.extend(diagnosis.hints(task.lines))
    if shown and not title.startswith("last "):
        lines.append(f"log: {task.log_path}")
    return "\n".join(lines)


def _state(task: TaskView) -> str:
    where = f"port {task.port}" if task.port is not None else ""
    if task.waits_for_ready and task.joined:
        return f"listened on {where} but never joined the cluster"
    if task.port is not None and task.joined is False:
        if task.coordinator_port is None or task.coordinator_port == task.port:
            return f"never listened on {where}"
        return f"never joined: it neither listened on {where} nor connected to the coordinator's port {task.coordinator_port}"
    return "never reported ready"


def start_timeout_summary(head: str, missing: Sequence[TaskView]) -> str:
    """`head`, then per task that never started: what it did not do, and what it printed last."""
    lines = [head]
    hints: list[str] = []
    for task in missing:
        lines.append(f"{task.name} on {task.host} {_state(task)} (log: {task.log_path})")
        last = diagnosis.last_words(task.lines)
        if last:
            lines.append("  it printed last:")
            lines.extend("    " + console_safe(line) for line in last)
        else:
            lines.append("  it printed nothing" + (" but TensorFlow's start-up notices" if task.lines else ""))
        hints.extend(h for h in diagnosis.hints(task.lines) if h not in hints)
    lines.extend(hints)
    return "\n".join(lines)


SHOWN_FRAMES = 4


def stall_summary(head: str, tasks: Sequence[TaskView], stacks_path: pathlib.Path) -> str:
    """`head` with the likely cause (the tasks in their own code while the others wait in the
    framework), then where each task was, and where the stacks are."""
    places = [(task, stacks.whereabouts(task.lines)) for task in tasks]
    known = [(task, where) for task, where in places if where is not None]
    own = [task.name for task, where in known if where.in_own_code]
    if own and len(own) < len(known):
        head += f"; likely cause: {', '.join(own)}, in {'its' if len(own) == 1 else 'their'} own code while the others wait"
    elif known and not own:
        head += "; every task waits inside the framework (a hang in it, or the network between the tasks)"
    lines = [head]
    for task, where in places:
        if where is None:
            lines.append(f"{task.name} on {task.host}: no Python stack (not a Python program, or faulthandler "
                         f"turned off) (log: {task.log_path})")
            continue
        state = "in its own code, not in a collective" if where.in_own_code else f"waiting in {where.framework}"
        lines.append(f"{task.name} on {task.host}: {state}")
        lines.extend("  " + console_safe(str(frame)) for frame in _telling_frames(where.frames))
    lines.append(f"stacks: {stacks_path}")
    return "\n".join(lines)


def _telling_frames(frames: Sequence[stacks.Frame]) -> list[stacks.Frame]:
    """The innermost frame, then the program's own frames (innermost first)."""
    if not frames:
        return []
    own = [f for f in frames[1:] if not stacks.is_library(f.file)]
    return [frames[0], *own[:SHOWN_FRAMES - 1]]


def closing_line(tasks: int, succeeded: int, wall_s: float, attempt: int, run_dir: pathlib.Path) -> str:
    """One line on success: tasks, wall time, restarts, and where logs and run.json are."""
    counted = f"{tasks} tasks succeeded" if succeeded == tasks else f"{succeeded} of {tasks} tasks succeeded"
    if attempt == 0:
        restarts = "no restarts"
    else:
        restarts = f"attempt {attempt + 1} succeeded after {attempt} restart{'s' if attempt > 1 else ''}"
    return f"done: {counted} in {wall_s:.1f} s, {restarts}; logs and run.json in {run_dir}/"
