"""`--setup`: one command on every host of the run, at once, before any task starts, in the
workdir the host's tasks run in, with the run's own variables (plan.HostSetup). Its output goes to
the console as `[setup HOST] ...` and to setup-HOST.log in the run's folder. A non-zero exit, or
one that outlives the timeout, stops the launch before any task starts, naming the host and the
last lines it printed. Restarts of the run do not run it again: it runs before supervision.

It starts as a task does, through the task's own backend, and is one for what it leaves behind:
tagged as a task is (the run's id, a launch id of its own, task type `setup`), in a process group
of its own, and swept as a task's processes are once it has ended, whether it succeeded, failed,
timed out, or mgpu was asked to stop (SIGINT, SIGTERM, SIGHUP): on this machine by the tags
(host/proctree.py), and by the reaper if mgpu dies meanwhile; over SSH by the remote wrapper's
guard when the setup's session ends (backends/ssh/remote_command.py), which a lost connection
ends too. What a setup starts to outlive it, a daemon the tasks would use, does not: that is a
task's to start.

Its output is a task's output (supervise/output.py): its log keeps every byte, the console gets
each line escaped (console_text.py) and a line longer than 64 KiB in pieces, so a setup's output
takes bounded memory however long its lines; and a console that does not keep up loses setup
lines, never holds up the setup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import signal
import sys
import time
from typing import Callable, Sequence, TextIO

from launcher import protocol
from launcher.backends.base import Backend, TaskProcess
from launcher.errors import CheckFailed, Interrupted, MgpuError
from launcher.plan.planner import TaskEnv, TaskPlan
from launcher.preflight.on_host import by_host, in_parallel
from launcher.supervise.console_text import console_safe
from launcher.supervise.output import LAUNCHER_PREFIX, Console, TaskOutput
from launcher.supervise.reaper import Reaper
from launcher.supervise.rundir import RunDir
from launcher.supervise.signals import Signals

SETUP_TYPE = "setup"
TAIL_LINES = 10  # lines of a failed setup's output shown in the error
_DRAIN_TIMEOUT = 10.0
# How long the launch waits for a console that does not read to take the setup's last lines, before
# it goes on to the checks (the lines are still written when the console reads again).
CONSOLE_WAIT = 5.0
_POLL = 0.05


def setup_log_name(host: str) -> str:
    return "setup-" + re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".log"


def run_setup(plans: Sequence[TaskPlan], backend_for: Callable[[TaskPlan], Backend], run_dir: RunDir,
              grace: float, console: TextIO = sys.stdout, clock: Callable[[], float] = time.monotonic,
              stop_on_signals: bool = True) -> None:
    """Run the plans' setup once on each of their hosts; CheckFailed naming the first host where it
    failed. `backend_for` names the backend a plan runs on; `grace`: the seconds a stopped setup's
    processes get between SIGTERM and SIGKILL (--grace-period). With `stop_on_signals`, SIGINT,
    SIGTERM and SIGHUP stop every setup and raise Interrupted (else they are left to whoever
    handles them)."""
    hosts = [group[0] for group in by_host(plans) if group[0].setup is not None]
    if not hosts:
        return
    run_id = hosts[0].env.get(protocol.ENV_RUN_ID)
    view = Console(console)
    # The run's guard is not there yet: this one stops the setups' processes on this machine if the
    # launcher dies (the run's id alone finds them: nothing else carries it yet).
    reaper = Reaper.start(run_id, grace, run_dir) if run_id and any(plan.local for plan in hosts) else None
    try:
        # A hang-up too: before the run has begun it ends the launch, as it would without a setup.
        with Signals(stop_on_hang_up=True) if stop_on_signals else contextlib.nullcontext() as signals:
            stopping = signals.received if signals is not None else []
            failures = [f for f in in_parallel(
                [lambda plan=plan: _run_on(plan, backend_for(plan), run_dir, view, grace, stopping, clock)
                 for plan in hosts], len(hosts)) if f]
            if stopping:
                raise Interrupted(stopping[0])
    finally:
        view.close(CONSOLE_WAIT)
        if reaper is not None:
            reaper.dismiss()
    if failures:
        raise CheckFailed(failures[0] + (f"\n(setup failed on {len(failures)} hosts)" if len(failures) > 1 else ""))
    print(f"mgpu: setup done on {len(hosts)} host(s)", file=sys.stderr, flush=True)


def setup_plan(plan: TaskPlan, launch_id: str | None = None) -> TaskPlan:
    """The task that runs the setup on `plan`'s host: a shell, in the plan's workdir, with the
    setup's variables (no TF_CONFIG, no job variables) and the tags that find its processes: the
    run's id, `launch_id` (the setup's own on each host, so that one host's sweep leaves another's
    setup alone), its type and index."""
    tags = {protocol.ENV_TASK_TYPE: SETUP_TYPE, protocol.ENV_TASK_INDEX: str(plan.index)}
    if launch_id is not None:
        tags[protocol.ENV_LAUNCH_ID] = launch_id
    return dataclasses.replace(plan, type=SETUP_TYPE, argv=("/bin/sh", "-c", plan.setup.command),
                               env=TaskEnv.of({**plan.setup.env, **tags}), port=None, coordinator=None,
                               waits_for_ready=False, secret_env=frozenset())


def _run_on(plan: TaskPlan, backend: Backend, run_dir: RunDir, view: Console, grace: float, stopping: list[int],
            clock: Callable[[], float]) -> str | None:
    """Run the setup on one host; None, or why it failed (with its last lines). A non-empty
    `stopping` (the signals mgpu received) stops it."""
    launch_id = secrets.token_hex(8)
    task = setup_plan(plan, launch_id)
    name = setup_log_name(plan.host)

    def notice(text: str) -> None:
        view.write_line(f"{LAUNCHER_PREFIX}{text}\n", always=True)

    output = TaskOutput(task, 0, run_dir / name, os.fdopen(run_dir.create(name), "wb"), view, timestamps=False,
                        show_tf_logs=True, notice=notice, prefix=f"[setup {plan.host}] ")
    try:
        try:
            proc = backend.start(task, 0)
        except MgpuError as e:
            return f"setup on {plan.host} did not start: {e}"
        try:
            output.attach(proc.stdout, proc.stderr)
            code, timed_out = _wait(proc, plan.setup.timeout, grace, stopping, clock)
        finally:
            try:
                # Whatever it started and left running goes with it (over SSH: when its session ends).
                run_id = task.env.get(protocol.ENV_RUN_ID)
                left = backend.sweep(run_id, grace, launch_id) if run_id else 0
                if left:
                    notice(f"stopped {left} processes that the setup on {plan.host} left running")
                output.drained(_DRAIN_TIMEOUT)
            finally:
                proc.close()
    finally:
        output.close()
    if stopping or (not timed_out and code == 0):
        return None
    why = f"did not finish within {plan.setup.timeout:g} s" if timed_out else _ended(code)
    tail = list(output.tail)[-TAIL_LINES:]
    last = "".join(f"\n  {console_safe(line.text)}" for line in tail) or "\n  (it printed nothing)"
    return (f"setup failed on {plan.host}: {why}; nothing was started. Its last lines:{last}\n"
            f"(all of its output: {run_dir / name})")


def _wait(proc: TaskProcess, timeout: float, grace: float, stopping: list[int],
          clock: Callable[[], float]) -> tuple[int | None, bool]:
    """Wait for the setup to end, for `timeout` seconds at most or until mgpu is asked to stop, then
    stop its process tree (TERM, `grace` seconds, KILL; KILL at once on a second signal): (its exit
    status, whether it timed out)."""
    deadline = clock() + timeout
    while (code := proc.poll()) is None and clock() < deadline and not stopping:
        time.sleep(_POLL)
    if code is not None:
        return code, False
    timed_out = not stopping
    proc.signal_tree(signal.SIGTERM)
    stop_by = clock() + grace
    while proc.poll() is None and clock() < stop_by and len(stopping) < 2:
        time.sleep(_POLL)
    if proc.poll() is None:
        proc.signal_tree(signal.SIGKILL)
    return proc.poll(), timed_out


def _ended(code: int | None) -> str:
    if code is None:
        return "still running after SIGKILL"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
