"""What mgpu says at the end of a run: the failure summary, the start-timeout report, the closing line.

Pure text building from what the supervisor saw; what task output means comes from diagnosis.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
from typing import Mapping, Sequence

from launcher.error_file import TaskError
from launcher.supervise import causes, diagnosis, fixes, stacks
from launcher.supervise.console_text import console_safe
from launcher.supervise.exit_rules import said_rule
from launcher.supervise.status import describe_exit, duration  # noqa: F401 - told here too, with the summaries


@dataclasses.dataclass(frozen=True)
class TaskView:
    """One task as the summaries need it."""

    name: str
    host: str
    port: int | None
    waits_for_ready: bool  # speaks the ready-line protocol
    tail: Sequence[diagnosis.TaskLine]  # its last lines of output, this attempt
    log_path: pathlib.Path
    joined: bool | None = None  # whether it listened on its port (or dialled the coordinator's); None: unknown
    coordinator_port: int | None = None  # a connection to it counts as joining; None: only listening counts
    returncode: int | None = None
    ended_at: float | None = None  # when the launcher saw it end (seconds since the epoch)
    bind_failure: int | None = None  # the port a "could not bind" line named (0: unnamed)
    error: TaskError | None = None  # what it wrote to its error file

    @property
    def lines(self) -> list[str]:
        return [line.text for line in self.tail]

    @property
    def stderr(self) -> list[str]:
        return [line.text for line in self.tail if line.stderr]

    def cause(self) -> tuple[str, list[str]]:
        title, shown = diagnosis.cause(self.lines, stderr=self.stderr, error=self.error)
        return title, [console_safe(line) for line in shown]  # output may carry terminal control sequences

    def hint_lines(self) -> list[str]:
        """Its output and what its error file says: where known failures are looked for."""
        if self.error is None:
            return self.lines
        return self.lines + self.error.message.splitlines() + (self.error.traceback or "").splitlines()

    def end(self, reporter: TaskView) -> diagnosis.TaskEnd:
        """How it ended, for blame: failed by itself if seen ended, non-zero, no later than `reporter`."""
        ended_first = self.ended_at is not None and reporter.ended_at is not None and self.ended_at <= reporter.ended_at
        failed = self.returncode not in (None, 0) and ended_first
        when = self.error.timestamp.timestamp() if self.error is not None else self.ended_at
        return diagnosis.TaskEnd(self.name, failed, when, running=not ended_first)

    def head(self) -> str:
        """"worker:0 on host exited with code 1", with the port it could not bind."""
        head = f"{self.name} on {self.host} {describe_exit(self.returncode)}"
        if self.bind_failure is not None:
            head += f": port in use: {self.host}:{self.bind_failure or self.port}"
        return head


def failure_summary(failed: TaskView, peers: Sequence[TaskView] = (), after: str = "") -> str:
    """Why the run failed, `failed` being the task that stopped it and `peers` the other training tasks.

    The first line names the task at fault (diagnosis.blame: a peer `failed` reports unhealthy,
    the coordination service's task when it stopped answering, a peer that failed before it, else
    `failed` itself) and `after` (the restarts). Then why it
    failed (its error file, else exception and frame, first error line, or its last lines), what
    `failed` reported when the fault was a peer's, known-failure hints, and where the logs are.
    """
    verdict = _verdict(failed, peers)
    if verdict.reason == diagnosis.REPORTER:
        return _one_task_summary(failed.head() + after, failed)
    at_fault = next(peer for peer in peers if peer.name == verdict.task)
    reported = f"{failed.name}, which {describe_exit(failed.returncode)}"
    if verdict.reason == diagnosis.UNHEALTHY:
        also = f", and so did {', '.join(verdict.others)}" if verdict.others else ""
        head = f"{at_fault.name} on {at_fault.host} stopped sending heartbeats{also} (reported by {reported})"
    elif verdict.reason == diagnosis.LEADER_SILENT:
        head = (f"{at_fault.name} on {at_fault.host} stopped answering heartbeats (it runs TensorFlow's "
                f"coordination service; reported by {reported})")
    else:
        head = f"{at_fault.head()} (before {reported})"
    lines = [head + after]
    title, shown = at_fault.cause()
    if shown and not title.startswith("last "):  # a frozen task's last lines say nothing of why
        lines.extend("  " + line for line in shown)
    lines.append(f"{failed.name} reported:")
    title, shown = failed.cause()
    lines.extend("  " + line for line in shown or ["nothing"])
    hints = fixes.hints(at_fault.hint_lines())
    lines.extend(hints + [h for h in fixes.hints(failed.hint_lines()) if h not in hints])
    lines.append(f"log: {at_fault.log_path}")
    lines.append(f"log: {failed.log_path}")
    return "\n".join(lines)


def _verdict(failed: TaskView, peers: Sequence[TaskView]) -> diagnosis.Blame:
    return diagnosis.blame(failed.end(failed), failed.hint_lines(), [peer.end(failed) for peer in peers])


def at_fault(failed: TaskView, peers: Sequence[TaskView] = ()) -> TaskView:
    """The task a failure is charged to: the one failure_summary names first."""
    verdict = _verdict(failed, peers)
    return next((peer for peer in peers if peer.name == verdict.task), failed)


def program_error(task: TaskView) -> str | None:
    """The task's program error in one line (its error file, else its exception and frame, else its
    first error line); None when its output says nothing of one."""
    title, shown = task.cause()
    if title.startswith("last ") or not shown:
        return None
    return " ".join(shown)


def _one_task_summary(head: str, task: TaskView) -> str:
    lines = [head]
    title, shown = task.cause()
    if not shown:
        lines.append(f"no output (log: {task.log_path})")
    elif title.startswith("last "):
        lines.append(f"{title} of {task.log_path}:")
        lines.extend("  " + line for line in shown)
    else:
        lines.extend("  " + line for line in shown)
    lines.extend(fixes.hints(task.hint_lines()))
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
        hints.extend(h for h in fixes.hints(task.lines) if h not in hints)
    lines.extend(hints)
    return "\n".join(lines)


SHOWN_FRAMES = 4


def stall_summary(head: str, tasks: Sequence[TaskView], stacks_path: pathlib.Path, stall_timeout: float | None = None,
                  stopped_at: float | None = None, spied: Mapping[str, stacks.Whereabouts | None] = {},
                  bundle: pathlib.Path | None = None, recorder: Sequence[str] = ()) -> str:
    """`head` with the likely cause (the tasks in their own code while the others wait in the
    framework), then where each task was, and where the stacks are. Where each task was is read
    from py-spy's stacks (`spied`, by task) or else from the faulthandler dump in its output. A
    task that had ended before `stopped_at` (when the stall was declared) is said to have ended,
    not to lack a stack."""
    ended = [task for task in tasks if task.returncode is not None and task.ended_at is not None
             and stopped_at is not None and task.ended_at <= stopped_at]
    places = [(task, spied.get(task.name) or stacks.whereabouts(task.lines)) for task in tasks if task not in ended]
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
    for task in ended:
        lines.append(f"{task.name} on {task.host}: {describe_exit(task.returncode)} before the stall")
    lines.extend(recorder)  # the flight recorder's verdict (flight_recorder.py), escaped already
    if bundle is not None:
        lines.append(f"evidence: {bundle}/ (its README says what is there)")
    lines.append(f"stacks: {stacks_path}")
    if stall_timeout:
        lines.append(f"hint: a program that computes for longer than {stall_timeout:g} s without printing is not "
                     f"stalled: give --stall-timeout a longer time (0: no stall watch), or print progress")
    return "\n".join(lines)


def _telling_frames(frames: Sequence[stacks.Frame]) -> list[stacks.Frame]:
    """The innermost frame, then the program's own frames (innermost first)."""
    if not frames:
        return []
    own = [f for f in frames[1:] if not f.native and not stacks.is_library(f.file)]
    return [frames[0], *own[:SHOWN_FRAMES - 1]]


def restart_story(cause: causes.Cause, at: float, took: str | None = None) -> str:
    """One failure that was restarted, in a few words: "h2 lost at 17:41: SSH keepalives
    unanswered; h5 took worker:1". `at`: seconds since the epoch, shown in local time."""
    when = datetime.datetime.fromtimestamp(at).strftime("%H:%M")
    if cause.kind == causes.HOST_LOST:
        story = f"{cause.host} lost at {when}: {cause.detail}"
    elif cause.kind == causes.NETWORK:
        story = f"{cause.host} unreachable at {when}: {cause.detail}"
    elif cause.kind == causes.PREEMPTED:
        story = f"{cause.task} preempted at {when}" + (f" (rule {said_rule(cause.rule)})" if cause.rule else "")
    elif cause.kind == causes.KILLED:
        how = "out of memory" if "OOM killer" in cause.detail else "SIGKILL"
        story = f"{cause.task} on {cause.host} killed at {when} ({how})"
    elif cause.kind == causes.PROGRAM_ERROR:
        story = f"{cause.task} failed at {when}: {cause.detail}"
    else:
        story = f"{cause.kind} at {when}"
    return f"{story}; {took}" if took else story


def closing_line(tasks: int, succeeded: int, wall_s: float, attempt: int, run_dir: pathlib.Path,
                 restarts: Sequence[str] = (), lost_s: float = 0.0, costs: dict | None = None,
                 in_place: int = 0) -> str:
    """One line on success: tasks, wall time, restarts (`restarts`: restart_story of each) and the
    time they lost, workers restarted in place (`in_place`), and where logs and run.json are. With
    `costs` (run.json's), the goodput and the time lost by cause as `mgpu status` says them
    (lost_time.told), in place of `lost_s`."""
    from launcher.supervise.lost_time import told as told_costs  # it says durations as this module does
    counted = f"{tasks} tasks succeeded" if succeeded == tasks else f"{succeeded} of {tasks} tasks succeeded"
    where = f"logs and run.json in {run_dir}/"
    if in_place:
        where = f"{in_place} worker restart{'s' if in_place > 1 else ''} in place; {where}"
    if costs is not None:
        wall_s = costs.get("wall_s", wall_s)
    if attempt == 0:  # without restarts or steps there is nothing to tell of its costs
        told = f"; {told_costs(costs)}" if costs and costs.get("goodput") is not None else ""
        return f"done: {counted} in {duration(wall_s)}, no restarts{' of the cluster' if in_place else ''}{told}; {where}"
    count = f"{attempt} restart{'s' if attempt > 1 else ''}"
    shown = [console_safe(story) for story in restarts[:MAX_STORIES]]
    if len(restarts) > MAX_STORIES:
        shown.append(f"{len(restarts) - MAX_STORIES} more in run.json")
    told = f" ({', '.join(shown)})" if shown else ""
    lost = told_costs(costs) if costs is not None else f"{duration(lost_s)} lost"
    return f"done: {counted} in {duration(wall_s)}; {count}{told}; {lost}; {where}"


MAX_STORIES = 3  # restarts told in the closing line; run.json has them all
