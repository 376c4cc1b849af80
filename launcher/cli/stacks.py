"""`mgpu stacks`: the stacks of a live run's tasks, read by py-spy where they run; nothing is stopped."""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import click

from launcher.cli.main import cli
from launcher.cli.runs import RUN_HELP, log_dir_option
from launcher.errors import MgpuError, UsageError
from launcher.supervise import runs, stacks_request
from launcher.supervise.console_text import console_safe
from launcher.supervise.evidence import SPY_TIMEOUT

# Beyond py-spy's own time: the supervisor's next look, and a loaded machine.
ANSWER_MARGIN = 30.0
ANSWER_LIMIT = 64 << 20  # bytes of the answer read
DONE_LIMIT = 1 << 20

STACKS_HELP = f"""Every thread's stack of every process of a running run's tasks, read by
py-spy where each task runs (this machine, SSH hosts), the tasks going on;
printed and kept in the run's folder (stacks-<time>.txt).

{RUN_HELP} py-spy must be installed where the tasks run (`pip install
py-spy`; `mgpu check` says where it is missing). Where the host forbids
attaching (another user's processes, kernel.yama.ptrace_scope, a container
without SYS_PTRACE) one line says so and what to change.

\b
Examples:
  mgpu stacks last
  mgpu stacks last --task worker:1 --native

Exit codes: 0 when every task's stacks were read; 1 when some were not (the
lines on stderr say why); 2 when RUN is not a running run of yours.
"""


def _read(run: runs.Run, name: str, limit: int) -> str | None:
    fd = runs.open_log(run, name)
    if fd is None:
        return None
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    return data[:limit].decode("utf-8", "replace")


@cli.command("stacks", help=STACKS_HELP)
@click.argument("run_name", metavar="RUN")
@log_dir_option
@click.option("--task", metavar="TYPE:INDEX", help="Only this task (e.g. worker:1).")
@click.option("--native", is_flag=True, help="Also the C and C++ frames below Python's (a collective's wait).")
def stacks_command(run_name: str, log_dir: pathlib.Path, task: str | None, native: bool) -> int:
    run = runs.find(log_dir, run_name)
    shown = console_safe(run.run_id)
    if task is not None and task not in run.task_names():
        names = ", ".join(console_safe(name) for name in run.task_names())
        raise UsageError(f"run {shown} has no task {console_safe(repr(task))}; its tasks: {names}")
    if not run.supervised():
        raise UsageError(f"run {shown} is not running ({console_safe(run.state)}): stacks are read from live tasks")
    stamp = stacks_request.new_stamp()
    try:
        stacks_request.write_request(run.path, stamp, task, native)
    except OSError as e:
        raise UsageError(f"run {shown}: cannot leave the request in {console_safe(str(run.path))}: "
                         f"{e.strerror or e}") from None
    deadline = time.monotonic() + SPY_TIMEOUT + ANSWER_MARGIN
    done = None
    while time.monotonic() < deadline:
        done = _read(run, stacks_request.done_name(stamp), DONE_LIMIT)
        if done is not None or not run.supervised():
            break
        time.sleep(0.2)
    if done is None:
        try:
            os.unlink(run.path / stacks_request.request_name(stamp))
        except OSError:
            pass
        raise MgpuError(f"run {shown}: no answer from its supervisor"
                        + (" (the run has ended)" if not run.supervised() else f" within {SPY_TIMEOUT + ANSWER_MARGIN:g} s"))
    text = _read(run, stacks_request.stacks_name(stamp), ANSWER_LIMIT) or ""
    try:
        answer = json.loads(done)
    except ValueError:
        answer = {}
    problems = answer.get("problems") if isinstance(answer, dict) else None
    problems = [p for p in problems if isinstance(p, str)] if isinstance(problems, list) else ["no answer read"]
    out = sys.stdout
    for line in text.splitlines():
        out.write(console_safe(line) + "\n")
    out.flush()
    for problem in problems:
        for line in problem.splitlines():
            click.echo(f"mgpu: {console_safe(line)}", err=True)
    if text:
        click.echo(f"mgpu: kept in {console_safe(str(run.path / stacks_request.stacks_name(stamp)))}", err=True)
    return 1 if problems else 0
