"""`--setup`: one command on every host of the run, at once, before any task starts, in the
workdir the host's tasks run in, with the run's own variables (plan.HostSetup). Its output goes to
the console as `[setup HOST] ...` and to setup-HOST.log in the run's folder. A non-zero exit, or
one that outlives the timeout, stops the launch before any task starts, naming the host and the
last lines it printed. Restarts of the run do not run it again: it runs before supervision.

It starts as a task does, through the task's own backend (local, or SSH with the remote wrapper
that ends whatever the command started when its session ends).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import signal
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from launcher.errors import CheckFailed, MgpuError
from launcher.plan.planner import TaskEnv, TaskPlan
from launcher.preflight.on_host import by_host, in_parallel
from launcher.supervise.rundir import RunDir

SETUP_TYPE = "setup"
TAIL_LINES = 10  # lines of a failed setup's output shown in the error
_STOP_GRACE = 5.0  # TERM, then this long, then KILL
_DRAIN_TIMEOUT = 10.0
_POLL = 0.05


def setup_log_name(host: str) -> str:
    return "setup-" + re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".log"


def run_setup(plans: Sequence[TaskPlan], start: Callable[[TaskPlan], object], run_dir: RunDir,
              console: TextIO = sys.stdout, clock: Callable[[], float] = time.monotonic) -> None:
    """Run the plans' setup once on each of their hosts; CheckFailed naming the first host where it
    failed. `start` starts a plan as its backend does (returns a TaskProcess)."""
    hosts = [group[0] for group in by_host(plans) if group[0].setup is not None]
    if not hosts:
        return
    lock = threading.Lock()
    failures = [f for f in in_parallel([lambda plan=plan: _run_on(plan, start, run_dir, console, lock, clock)
                                        for plan in hosts], len(hosts)) if f]
    if failures:
        raise CheckFailed(failures[0] + (f"\n(setup failed on {len(failures)} hosts)" if len(failures) > 1 else ""))
    print(f"mgpu: setup done on {len(hosts)} host(s)", file=sys.stderr, flush=True)


def setup_plan(plan: TaskPlan) -> TaskPlan:
    """The task that runs the setup on `plan`'s host: a shell, in the plan's workdir, with the
    setup's variables only (no TF_CONFIG, no job variables)."""
    return dataclasses.replace(plan, type=SETUP_TYPE, argv=("/bin/sh", "-c", plan.setup.command),
                               env=TaskEnv.of(plan.setup.env), port=None, coordinator=None, waits_for_ready=False,
                               secret_env=frozenset())


def _run_on(plan: TaskPlan, start, run_dir: RunDir, console: TextIO, lock: threading.Lock,
            clock: Callable[[], float]) -> str | None:
    """Run the setup on one host; None, or why it failed (with its last lines)."""
    name = setup_log_name(plan.host)
    log = run_dir.create(name)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    prefix = f"[setup {plan.host}] "
    try:
        try:
            proc = start(setup_plan(plan))
        except MgpuError as e:
            return f"setup on {plan.host} did not start: {e}"
        try:
            readers = [threading.Thread(target=_copy_lines, args=(stream, log, console, prefix, tail, lock),
                                        daemon=True, name=f"mgpu-setup {plan.host}")
                       for stream in (proc.stdout, proc.stderr)]
            for reader in readers:
                reader.start()
            deadline = clock() + plan.setup.timeout
            while (code := proc.poll()) is None and clock() < deadline:
                time.sleep(_POLL)
            timed_out = code is None
            if timed_out:
                proc.signal_tree(signal.SIGTERM)
                stop_by = clock() + _STOP_GRACE
                while proc.poll() is None and clock() < stop_by:
                    time.sleep(_POLL)
                if proc.poll() is None:
                    proc.signal_tree(signal.SIGKILL)
            for reader in readers:
                reader.join(_DRAIN_TIMEOUT)
        finally:
            proc.close()
    finally:
        os.close(log)
    if not timed_out and code == 0:
        return None
    why = f"did not finish within {plan.setup.timeout:g} s" if timed_out else _ended(code)
    last = "".join(f"\n  {line}" for line in tail) or "\n  (it printed nothing)"
    return (f"setup failed on {plan.host}: {why}; nothing was started. Its last lines:{last}\n"
            f"(all of its output: {run_dir / name})")


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _copy_lines(stream, log: int, console: TextIO, prefix: str, tail: collections.deque, lock: threading.Lock) -> None:
    while line := stream.readline():
        os.write(log, line)
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        with lock:
            tail.append(text)
            console.write(prefix + text + "\n")
            console.flush()
