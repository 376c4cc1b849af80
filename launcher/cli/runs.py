"""The commands that look at runs after their launch: status, logs, attach and stop."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys

import click

from launcher.cli.main import cli
from launcher.errors import MgpuError, UsageError
from launcher.supervise import lost_time, runrecord, runs
from launcher.supervise.console_text import console_safe
from launcher.supervise.run_files import SafeOutput
from launcher.supervise.options import DEFAULT_LOG_DIR
from launcher.supervise.rundir import CONSOLE_LOG

ATTACH_TAIL_LINES = 40  # of the console shown when attaching, before what comes next
STOP_TIMEOUT_MARGIN = 120.0  # beyond the grace period, how long `mgpu stop` waits for the end

RUN_HELP = "RUN is a run id, a unique start of one, or `last` (the newest run of the log dir)."

log_dir_option = click.option(
    "--log-dir", type=click.Path(file_okay=False, path_type=pathlib.Path), default=DEFAULT_LOG_DIR,
    show_default=True, help="Where the runs are (the --log-dir of their launch).")


def _time(iso: str | None) -> str:
    """'2026-01-02T03:04:05.678+00:00' as '2026-01-02 03:04:05' (UTC)."""
    return (iso or "-")[:19].replace("T", " ")


def _progress(progress: dict | None) -> str:
    if not progress:
        return "-"
    step, total = progress.get("step"), progress.get("total")
    text = f"{step}/{total} ({100 * step // total}%)" if total else f"{step}"
    if progress.get("rate"):
        text += f" {progress['rate']:g} steps/s"
    if progress.get("eta_s") is not None:
        text += f" ETA {_duration(progress['eta_s'])}"
    return text


def _busy(busy: dict | None) -> str:
    """The task's busy share of the last minute or so: how much it computed rather than waited."""
    if not busy or busy.get("share") is None:
        return "-"
    return f"{round(100 * busy['share'])}%" + ("" if busy.get("source") == "cpu" else "*")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _run_progress(run: runs.Run) -> dict | None:
    """The progress of the run: its slowest task that reports any."""
    reported = [task["progress"] for task in run.tasks.values() if task.get("progress")]
    return min(reported, key=lambda p: p.get("step", 0)) if reported else None


def _hosts(run: runs.Run) -> list[str]:
    return list(dict.fromkeys(str(plan.get("host")) for plan in run.record.get("plans", [])))


def _summary(run: runs.Run) -> dict:
    if run.problem is not None:
        return {"run_id": run.run_id, "state": run.state, "problem": run.problem, "path": str(run.path)}
    return {"run_id": run.run_id, "state": run.state, "started_at": run.record.get("started_at"),
            "ended_at": run.record.get("ended_at"), "tasks": len(run.task_names()), "hosts": _hosts(run),
            "restarts": max(0, len(run.attempts) - 1), "progress": _run_progress(run),
            "exit_code": run.record.get("exit_code"), "path": str(run.path)}


def size_line(size: dict) -> str | None:
    """What `mgpu status RUN` says of a run on fewer hosts than planned (--min-hosts), from run.json's
    `size` (anyone's text: only whole numbers and the time are used); None when it says nothing,
    as when the run is back on all the hosts it was planned on."""
    hosts, planned = size.get("hosts"), size.get("planned_hosts")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 10**6 for n in (hosts, planned)):
        return None
    if hosts >= planned:
        return None
    since = size.get("since")
    return f"size: {hosts} of {planned} hosts" + (f" since {_time(since)} (UTC)" if isinstance(since, str) else "")


def _table(rows: list[list[str]]) -> str:
    """The rows as columns, every cell as a terminal may show it (a record's text is anyone's)."""
    rows = [[console_safe(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _task_state(task: dict) -> str:
    if task.get("ended_at") is None:
        return "running"
    if task.get("signal"):
        return task["signal"]
    return f"exit {task.get('exit_code')}"


STATUS_HELP = f"""The runs of the log dir, newest first; with RUN, each task of it.

{RUN_HELP} BUSY is how much of the last minute a task computed rather than
waited for the others (from CPU samples; * from the task's own time split);
in a synchronous job the busiest task is the one the others wait for.

\b
Examples:
  mgpu status
  mgpu status last
  mgpu status 20260102-030405 --json

Exit codes: 0, or 2 when RUN is not a run of yours in the log dir.
"""


@cli.command("status", help=STATUS_HELP)
@click.argument("run_name", metavar="[RUN]", required=False)
@log_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the list of runs, or RUN's run.json with its state.")
def status_command(run_name: str | None, log_dir: pathlib.Path, as_json: bool) -> None:
    if run_name is None:
        found = runs.runs(log_dir)
        if as_json:
            click.echo(json.dumps([_summary(run) for run in found], indent=2))
            return
        if not found:
            click.echo(f"no runs in {log_dir}")
            return
        rows = [["RUN", "STATE", "STARTED (UTC)", "TASKS", "HOSTS", "RESTARTS", "PROGRESS"]]
        for run in found:
            if run.problem is not None:  # one line, whatever is wrong with it
                rows.append([run.run_id, run.state, "-", "-", "-", "-", run.problem[:120]])
                continue
            summary = _summary(run)
            hosts = summary["hosts"]
            rows.append([run.run_id, summary["state"], _time(summary["started_at"]), str(summary["tasks"]),
                         ",".join(hosts[:3]) + (f",+{len(hosts) - 3}" if len(hosts) > 3 else ""),
                         str(summary["restarts"]), _progress(summary["progress"])])
        click.echo(_table(rows))
        return
    run = runs.find(log_dir, run_name)
    if as_json:
        try:
            text = json.dumps({**run.record, "state": run.state}, indent=2)
        except (RecursionError, ValueError):
            raise UsageError(f"run {console_safe(run.run_id)}: its run.json is nested too deeply to print") from None
        click.echo(text)
        return
    record = run.record
    state = run.state
    ended = f", ended {_time(record.get('ended_at'))}" if record.get("ended_at") else ""
    code = f" (exit {record['exit_code']})" if record.get("exit_code") is not None else ""
    where = "" if run.here else f" on {record.get('supervisor_host')}"
    supervisor = f"supervisor pid {run.supervisor_pid}{where}" if state == runrecord.RUNNING else "supervisor gone"
    click.echo(console_safe(f"run {run.run_id}: {state}{code}; started {_time(record.get('started_at'))}{ended} "
                            f"(UTC); {_restarts(max(0, len(run.attempts) - 1))}; {supervisor}"))
    click.echo(console_safe(f"files: {run.path}/"))
    size = size_line(record["size"]) if isinstance(record.get("size"), dict) else None
    if size:
        click.echo(console_safe(size))
    if record.get("message"):
        click.echo(console_safe((str(record["message"]).splitlines() or [""])[0]))
    rows = [["TASK", "HOST", "PID", "STATE", "READY", "PROGRESS", "BUSY", "LAST LINE"]]
    for name, task in run.tasks.items():
        rows.append([name, str(task.get("host", "-")), str(task.get("pid", "-")), _task_state(task),
                     _time(task.get("ready_at"))[11:] or "-", _progress(task.get("progress")), _busy(task.get("busy")),
                     (task.get("last_line") or "")[:80]])
    click.echo(_table(rows))
    if isinstance(record.get("costs"), dict) and (record["costs"].get("goodput") is not None or len(run.attempts) > 1):
        # the closing line's figures (a running run's, to its last attempt's end)
        so_far = " (to the last attempt's end)" if state == runrecord.RUNNING else ""
        click.echo(console_safe(f"costs{so_far}: {lost_time.told(record['costs'])}"))
    slowest = (run.attempts[-1] if run.attempts else {}).get("slowest")
    if slowest:
        busy = round(100 * slowest["busy"])
        click.echo(console_safe(f"slowest: {slowest['task']} on {slowest['host']}, busy {busy}% "
                                f"while the others waited (since {_time(slowest.get('at'))[11:]})"))


LOGS_HELP = f"""The console of a run as `mgpu launch` showed it, or one task's log.

{RUN_HELP} The console is kept (console.log) for detached runs and for
the part of a run after its terminal closed; every task's log is always kept.

\b
Examples:
  mgpu logs last -f
  mgpu logs 20260102-030405 --task worker:1

Exit codes: 0; with -f, the run's own exit code once it ends; 2 when RUN is
not a run of yours or has no such log.
"""


def _log_name(run: runs.Run, task: str | None) -> str:
    """The file of the run's folder that `mgpu logs` shows: the console, or the task's log."""
    names = ", ".join(console_safe(name) for name in run.task_names())
    shown = console_safe(run.run_id)
    if task is None:
        fd = runs.open_log(run, CONSOLE_LOG)
        if fd is None:
            raise UsageError(f"run {shown} keeps its console on the terminal that launched it (no {CONSOLE_LOG}); "
                             f"`mgpu logs {shown} --task NAME` shows a task's log, one of {names}")
        os.close(fd)
        return CONSOLE_LOG
    if task not in run.task_names():
        raise UsageError(f"run {shown} has no task {console_safe(repr(task))}; its tasks: {names}")
    task_type, _, index = task.partition(":")
    return f"{task_type}-{index}.log"


@cli.command("logs", help=LOGS_HELP)
@click.argument("run_name", metavar="RUN")
@log_dir_option
@click.option("--task", metavar="TYPE:INDEX", help="This task's log (e.g. worker:1) instead of the console.")
@click.option("-f", "--follow", is_flag=True, help="Go on printing what comes until the run ends; exit with its code.")
@click.option("--raw", is_flag=True, help="The bytes as written, control characters and all (for a file, "
                                          "not a terminal).")
def logs_command(run_name: str, log_dir: pathlib.Path, task: str | None, follow: bool, raw: bool) -> int:
    run = runs.find(log_dir, run_name)
    name = _log_name(run, task)
    out = sys.stdout.buffer if raw else SafeOutput(sys.stdout.buffer)
    if not follow:
        fd = runs.open_log(run, name)
        if fd is None:
            raise UsageError(f"run {console_safe(run.run_id)} has no {name} (yet)")
        try:
            runs.copy(fd, out)
        finally:
            os.close(fd)
        return 0
    try:
        ended = runs.follow(name, run, out)
    except KeyboardInterrupt:
        return 130
    return ended.exit_code


ATTACH_HELP = f"""The live console of a running run; Ctrl-C leaves it (the run goes on).

{RUN_HELP} Shows the console's last lines, then what comes, until the
run ends (then exits with the run's exit code) or Ctrl-C.

Exit codes: 0 after Ctrl-C; the run's own once it ends; 2 when RUN is not a
running run of yours with its console in console.log.
"""


@cli.command("attach", help=ATTACH_HELP)
@click.argument("run_name", metavar="RUN")
@log_dir_option
def attach_command(run_name: str, log_dir: pathlib.Path) -> int:
    run = runs.find(log_dir, run_name)
    shown = console_safe(run.run_id)
    if not run.supervised():
        raise UsageError(f"run {shown} is not running ({console_safe(run.state)}); "
                         f"`mgpu logs {shown}` shows its console")
    name = _log_name(run, None)
    fd = runs.open_log(run, name)
    try:
        start = 0 if fd is None else runs.tail_start(fd, ATTACH_TAIL_LINES)
    finally:
        if fd is not None:
            os.close(fd)
    click.echo(f"mgpu: attached to run {shown}; Ctrl-C leaves it running", err=True)
    try:
        ended = runs.follow(name, run, SafeOutput(sys.stdout.buffer), start=start)
    except KeyboardInterrupt:
        click.echo(f"\nmgpu: detached from run {shown}; it goes on (`mgpu stop {shown}` stops it)", err=True)
        return 0
    click.echo(f"mgpu: run {shown} {console_safe(ended.state)} (exit {ended.exit_code})", err=True)
    return ended.exit_code


STOP_HELP = f"""Stop a run as Ctrl-C stops `mgpu launch`: TERM to every task, KILL after the
grace period, nothing left on any host; wait for the end and print how it ended.

{RUN_HELP} A run whose folder is gone (or in another log dir) is found by
its whole run id, from the lock its supervisor holds on this machine. A stop
while another is under way waits for it; only --now hurries it.

Exit codes: 0 once the run has stopped; 1 if it did not end in time; 2 when RUN
is not a running run of yours.
"""


@cli.command("stop", help=STOP_HELP)
@click.argument("run_name", metavar="RUN")
@log_dir_option
@click.option("--now", is_flag=True, help="Kill the tasks at once, without the grace period.")
def stop_command(run_name: str, log_dir: pathlib.Path, now: bool) -> int:
    try:
        run = runs.find(log_dir, run_name)
    except UsageError:
        pid = runs.lock_holder(run_name)
        if pid is None:
            raise
        return _stop_by_lock(run_name, pid, log_dir, now)
    shown = console_safe(run.run_id)
    pid = run.supervisor_pid
    if not run.here:
        where = console_safe(str(run.record.get("supervisor_host")))
        raise UsageError(f"run {shown} is supervised on {where}: stop it there (or, in a Slurm job, with scancel)")
    if not run.supervised() or pid is None:
        raise UsageError(f"run {shown} is not running ({console_safe(run.state)})")
    _signal(pid, now, shown)
    click.echo(f"mgpu: stopping run {shown} (supervisor pid {pid})" + (", killing its tasks now" if now else ""),
               err=True)
    grace = float((run.record.get("options") or {}).get("grace_period") or 0)
    ended = runs.wait_until_ended(run, timeout=grace + STOP_TIMEOUT_MARGIN)
    if ended.supervised():
        raise MgpuError(f"run {shown} has not ended {grace + STOP_TIMEOUT_MARGIN:g} s later (supervisor pid {pid})")
    message = "\n".join(console_safe(line) for line in str(ended.record.get("message") or "").splitlines())
    click.echo(f"mgpu: run {shown} {console_safe(ended.state)} (exit {ended.exit_code})"
               + (f": {message}" if message else ""))
    return 0


def _signal(pid: int, now: bool, shown: str) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        if now:  # a second signal: no grace period
            os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise UsageError(f"run {shown} is not yours to stop") from None


def _stop_by_lock(run_id: str, pid: int, log_dir: pathlib.Path, now: bool) -> int:
    """A run with no folder in the log dir whose supervisor holds its run id's lock: stopped all
    the same (the lock's folder is private to this user, and the kernel drops the lock with its
    holder). Its grace period is not known here, so the wait is STOP_TIMEOUT_MARGIN."""
    _signal(pid, now, run_id)
    click.echo(f"mgpu: stopping run {run_id} (supervisor pid {pid}, from its run id's lock: no folder of it in "
               f"{console_safe(str(log_dir))})" + (", killing its tasks now" if now else ""), err=True)
    if not runs.wait_until_released(run_id, pid, STOP_TIMEOUT_MARGIN):
        raise MgpuError(f"run {run_id} has not ended {STOP_TIMEOUT_MARGIN:g} s later (supervisor pid {pid}; "
                        f"`mgpu stop {run_id} --now` kills its tasks at once)")
    click.echo(f"mgpu: run {run_id} stopped (with no run folder in {console_safe(str(log_dir))}, how it ended is "
               f"not known here)")
    return 0


def _restarts(count: int) -> str:
    return "1 restart" if count == 1 else f"{count} restarts"
