"""run.json: what a run planned and what happened to every task in every attempt.

The file is rewritten (write a new temporary file in the run dir, then rename)
as things happen, so a reader always sees a complete JSON document. Task events
are written at most every WRITE_INTERVAL seconds (flush() writes what is left),
so the cost of a run stays linear in its number of tasks; attempts and the final
status are written at once. The plans, which never change, are serialised once.
A write that fails (a full disk) never stops the run: it is reported once, the
file keeps its last complete version, and flush() tries again every
RETRY_INTERVAL seconds, so the record is brought up to date once there is space.

Layout:
  run_id, status (running | succeeded | failed | interrupted | start-timeout | stalled |
  launcher-died),
  message (the failure summary, else null), exit_code (mgpu launch's, once ended),
  supervisor_pid (the process that supervises the run: mgpu launch, or its detached supervisor),
  supervisor_host (the name of the machine it runs on) and lock_dir (the folder of the run id's
  lock, which the supervisor holds while it runs: how `mgpu status` from any shell tells),
  started_at, ended_at,
  options (the supervision settings), plans (one dict per TaskPlan),
  attempts: [{attempt, started_at, ended_at, outcome, tasks: {"worker:0": {
      host, pid, log, started_at, ready_at, ended_at, exit_code, signal,
      failure_ignored, last_line, progress: {step, total, rate, eta_s, at},
      busy: {share, source, window_s}}},
      ready_at (every training task ready), progress ({last_step, gained}, where reported),
      time_lost_s, new_steps_s, lost_s ({start_up, redone, after_last_step, stalled, finish}: lost_time.py),
      restart_before_s, slowest (the task the others waited for, once named: pace.py's
      {task, host, busy, others, source, window_s, at}), and for a failed attempt: cause
      (causes.py), task, host, detail}],
  costs: {restarts, left_out: [{host, cause, at, replaced_by}], wall_s, time_lost_s, new_steps_s,
      lost_s ({start_up, redone, after_last_step, stalled, restart, finish}), goodput (null: no steps)}
exit_code is the task's exit status; when it died by a signal, exit_code is
null and signal holds its name ("SIGKILL"). failure_ignored is true for a
sidecar (the evaluator) that failed while training went on without it.
last_line is the task's last line of output and progress its last progress line (protocol.py),
with the steps per second since its first one and the seconds left at that rate (null when
unknown); both are written at most every PROGRESS_INTERVAL seconds. busy is the task's latest busy
share (supervise/pace.py): the part of the last window_s seconds it computed rather than waited,
from its own time split (source "split") or CPU samples ("cpu").
Times are UTC, ISO 8601.

run-end.json is where the run's end goes when run.json cannot take it (a full disk): made at the
start as END_BYTES of spaces, so its blocks are taken while there is room, and overwritten in place
at the end with {status, message, exit_code, ended_at}, padded to the same size. Readers take the
end from it when run.json still says running (supervise/runs.py).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import textwrap
import threading
import time
from typing import Any, Callable, Sequence

from launcher.plan.planner import TaskPlan
from launcher.plan.render import plan_to_dict
from launcher.supervise import run_lock
from launcher.supervise.rundir import RunDir

NAME = "run.json"
END_NAME = "run-end.json"
END_BYTES = 4096
WRITE_INTERVAL = 0.2
RETRY_INTERVAL = 1.0  # after a failed write
PROGRESS_INTERVAL = 2.0

# The statuses, told where the rules can read them without this module (status.py).
from launcher.supervise.status import (  # noqa: E402,F401
    FAILED, INTERRUPTED, LAUNCHER_DIED, RUNNING, START_TIMEOUT, STALLED, SUCCEEDED, signal_name,
)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def utc(epoch: float) -> str:
    """Seconds since the epoch as the record writes times."""
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="milliseconds")


def record_launcher_died(run_dir: RunDir, message: str) -> None:
    """Mark the run (and its unfinished attempt) as ended by the launcher's death: what the
    reaper writes, since the launcher cannot. A run.json already final is left as it is."""
    try:
        fd = os.open(NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=run_dir.fd)
    except FileNotFoundError:
        return
    with os.fdopen(fd, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("status") != RUNNING:
        return
    ended = now()
    data.update(status=LAUNCHER_DIED, message=message, exit_code=1, ended_at=ended)
    for attempt in data.get("attempts", []):
        if attempt.get("ended_at") is None:
            attempt.update(ended_at=ended, outcome=LAUNCHER_DIED)
    try:
        _replace(run_dir, json.dumps(data, indent=2) + "\n")
    except OSError:
        if not write_end(run_dir, LAUNCHER_DIED, message, 1, ended):
            raise


def reserve_end(run_dir: RunDir) -> None:
    """Take the space of the run's end now, while there is room (see END_NAME)."""
    try:
        fd = run_dir.create(END_NAME)
    except OSError:
        return  # no room even now: the end can only go to run.json
    try:
        os.write(fd, b" " * (END_BYTES - 1) + b"\n")
    except OSError:
        run_dir.unlink(END_NAME)
    finally:
        os.close(fd)


def write_end(run_dir: RunDir, status: str, message: str | None, exit_code: int | None, ended_at: str) -> bool:
    """The run's end written over its reserved space, in place (no new block is needed); whether it was."""
    message = message or None
    while True:
        text = json.dumps({"status": status, "message": message, "exit_code": exit_code, "ended_at": ended_at})
        if len(text) < END_BYTES or not message:
            break
        message = message[:len(message) // 2]
    data = text.encode()[:END_BYTES - 1]
    try:
        fd = os.open(END_NAME, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=run_dir.fd)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size != END_BYTES:
            return False
        return os.pwrite(fd, data + b" " * (END_BYTES - 1 - len(data)) + b"\n", 0) == END_BYTES
    except OSError:
        return False
    finally:
        os.close(fd)


def _replace(run_dir: RunDir, text: str) -> None:
    """run.json replaced by `text`, whole or not at all: on an error (a full disk) the temporary
    file is removed, the file keeps its last complete version, and the error goes on up."""
    tmp = NAME + ".tmp"
    run_dir.unlink(tmp)  # left by a launcher that died half-way through a write
    try:
        with os.fdopen(run_dir.create(tmp), "w", encoding="utf-8") as f:
            f.write(text)
        run_dir.replace(tmp, NAME)
    except OSError:
        try:
            run_dir.unlink(tmp)  # gives its space back
        except OSError:
            pass
        raise


class RunRecord:
    """The run.json of one run. Thread-safe."""

    def __init__(self, run_dir: RunDir, run_id: str, plans: Sequence[TaskPlan], options: dict[str, Any],
                 show_secrets: bool = False, report: Callable[[str], None] = lambda text: None):
        """`report` gets one line, once, if run.json cannot be written (a full disk)."""
        self._run_dir = run_dir
        self._report = report
        self._behind = False  # the last write failed: the file on disk is an earlier version
        self._reported = False
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {
            "run_id": run_id,
            "status": RUNNING,
            "message": None,
            "exit_code": None,
            "supervisor_pid": os.getpid(),
            "supervisor_host": socket.gethostname(),
            "lock_dir": run_lock.claim_folder(run_id),
            "started_at": now(),
            "ended_at": None,
            "options": options,
            "attempts": [],
        }
        plans_text = json.dumps([plan_to_dict(p, show_secrets) for p in plans], indent=2)
        self._plans_text = textwrap.indent(plans_text, "  ").lstrip()
        self._dirty = False
        self._written_at = 0.0
        reserve_end(run_dir)
        self._write()

    def flush(self) -> None:
        """Write task events not written yet (after a failed write, at most every RETRY_INTERVAL)."""
        with self._lock:
            if self._dirty and (not self._behind or time.monotonic() - self._written_at >= RETRY_INTERVAL):
                self._write()

    def attempt_started(self, attempt: int, at: float | None = None) -> None:
        """`at`: seconds since the epoch, the time its costs count from (now if None)."""
        with self._lock:
            self._data["attempts"].append({"attempt": attempt, "started_at": now() if at is None else utc(at),
                                           "ended_at": None, "outcome": RUNNING, "tasks": {}})
            self._write()

    def task_started(self, plan: TaskPlan, pid: int, log: str) -> None:
        self._update_task(
            plan,
            host=plan.host,
            pid=pid,
            log=log,
            started_at=now(),
            ready_at=None,
            ended_at=None,
            exit_code=None,
            signal=None,
            failure_ignored=False,
        )

    def task_restarted_in_place(self, plan: TaskPlan, pid: int) -> None:
        """The task ended and was started again in the same attempt (in_place.py): counted, its end cleared."""
        with self._lock:
            count = self._data["attempts"][-1]["tasks"].get(plan.name, {}).get("restarts_in_place", 0) + 1
        self._update_task(plan, pid=pid, ended_at=None, exit_code=None, signal=None, restarts_in_place=count)

    def task_ready(self, plan: TaskPlan) -> None:
        self._update_task(plan, ready_at=now())

    def task_ended(self, plan: TaskPlan, returncode: int) -> None:
        if returncode < 0:
            self._update_task(plan, ended_at=now(), exit_code=None, signal=signal_name(-returncode))
        else:
            self._update_task(plan, ended_at=now(), exit_code=returncode, signal=None)

    def task_failure_ignored(self, plan: TaskPlan) -> None:
        self._update_task(plan, failure_ignored=True)

    def task_progress(self, plan: TaskPlan, last_line: str | None, progress: dict[str, Any] | None) -> None:
        """The task's last line and progress (written with the next flush)."""
        with self._lock:
            task = self._data["attempts"][-1]["tasks"].get(plan.name)
            if task is not None and (task.get("last_line"), task.get("progress")) != (last_line, progress):
                task.update(last_line=last_line, progress=progress)
                self._dirty = True

    def task_busy(self, plan: TaskPlan, busy: dict[str, Any] | None) -> None:
        """The task's latest busy share (written with the next flush)."""
        with self._lock:
            task = self._data["attempts"][-1]["tasks"].get(plan.name)
            if task is not None and task.get("busy") != busy:
                task["busy"] = busy
                self._dirty = True

    def attempt_slowest(self, slowest: dict[str, Any]) -> None:
        """The task the others waited for, once named."""
        with self._lock:
            self._data["attempts"][-1]["slowest"] = {**slowest, "at": now()}
            self._write()

    def attempt_flight_recorder(self, verdict: dict[str, Any]) -> None:
        """The flight recorder's verdict on a stalled attempt (flight_recorder.py)."""
        with self._lock:
            self._data["attempts"][-1]["flight_recorder"] = verdict
            self._write()

    def attempt_cause(self, cause: dict[str, Any]) -> None:
        """Why the last attempt failed (causes.Cause.to_dict): its cause, task, host and detail."""
        with self._lock:
            self._data["attempts"][-1].update(cause)
            self._write()

    def attempt_costs(self, **costs: Any) -> None:
        """What the last attempt cost: when all its tasks were ready, its progress, the time it lost."""
        with self._lock:
            self._data["attempts"][-1].update(costs)
            self._write()

    def run_costs(self, totals: dict[str, Any]) -> None:
        """What failures cost the run in all: restarts, hosts left out, time lost, goodput."""
        with self._lock:
            self._data["costs"] = totals

    def run_warning(self, text: str) -> None:
        """Something the run's end should not hide though it succeeded (run.json's "warnings")."""
        with self._lock:
            self._data.setdefault("warnings", []).append(text)
            self._write()

    def size_changed(self, change: dict[str, Any], size: dict[str, Any]) -> None:
        """The run goes on on fewer hosts (sizes.py): each change under "size_changes", the size now as "size"."""
        with self._lock:
            self._data.setdefault("size_changes", []).append(change)
            self._data["size"] = size
            self._write()

    def attempt_ended(self, outcome: str, at: float | None = None) -> None:
        with self._lock:
            attempt = self._data["attempts"][-1]
            attempt["ended_at"] = now() if at is None else utc(at)
            attempt["outcome"] = outcome
            self._write()

    def finish(self, status: str, message: str | None = None, exit_code: int | None = None) -> None:
        with self._lock:
            self._data["status"] = status
            self._data["message"] = message
            self._data["exit_code"] = exit_code
            self._data["ended_at"] = now()
            self._write()
            if self._behind:  # run.json could not take the end: its reserved place can
                write_end(self._run_dir, status, message, exit_code, self._data["ended_at"])

    def _update_task(self, plan: TaskPlan, **fields: Any) -> None:
        with self._lock:
            self._data["attempts"][-1]["tasks"].setdefault(plan.name, {}).update(fields)
            self._dirty = True
            if time.monotonic() - self._written_at >= (RETRY_INTERVAL if self._behind else WRITE_INTERVAL):
                self._write()

    def _write(self) -> None:
        """Never raises: the run goes on whatever becomes of its record."""
        head = json.dumps(self._data, indent=2)
        text = head[:-2] + ',\n  "plans": ' + self._plans_text + "\n}\n"  # head ends with "\n}"
        self._written_at = time.monotonic()
        try:
            _replace(self._run_dir, text)
        except OSError as exc:
            self._dirty = self._behind = True
            if not self._reported:
                self._reported = True
                self._report(f"cannot write {NAME} in {self._run_dir.path}: {exc.strerror or exc}; it keeps its "
                             f"last complete version until it can be written again")
            return
        self._dirty = self._behind = False
