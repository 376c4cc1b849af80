"""Helpers for supervisor tests: plans built directly, fake workers, process checks."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

from launcher.host import proctree
from launcher.plan.coordinator import Coordinator
from launcher.plan.planner import TaskPlan
from launcher.host.ports import pick_free_ports
from launching import MGPU, mgpu_env, run_mgpu

HERE = pathlib.Path(__file__).resolve().parent
FAKE_WORKER = (sys.executable, str(HERE / "programs" / "fake_worker.py"))


def make_plans(
    run_id: str,
    args: list[str] | tuple[str, ...],
    workers: int = 2,
    chief: bool = False,
    evaluator: bool = False,
    waits_for_ready: bool = False,
    workdir: str | None = None,
    env: dict[str, str] | None = None,
) -> list[TaskPlan]:
    """Local plans running the fake worker, with a TF_CONFIG like the planner's."""
    members = ([("chief", 0)] if chief else []) + [("worker", i) for i in range(workers)]
    ports = dict(zip(members, pick_free_ports(len(members))))
    cluster: dict[str, list[str]] = {}
    for (task_type, _), port in ports.items():
        cluster.setdefault(task_type, []).append(f"127.0.0.1:{port}")
    plans = []
    for task_type, index in members + ([("evaluator", 0)] if evaluator else []):
        task_env = {
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}),
            "MGPU_RUN_ID": run_id,
            "MGPU_TASK_TYPE": task_type,
            "MGPU_TASK_INDEX": str(index),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        plans.append(
            TaskPlan(
                type=task_type,
                index=index,
                host="127.0.0.1",
                port=ports.get((task_type, index)),
                local=True,
                ssh=None,
                argv=(*FAKE_WORKER, *args),
                env=task_env,
                workdir=workdir,
                waits_for_ready=waits_for_ready,
                coordinator=Coordinator("127.0.0.1", ports[members[0]]),
            )
        )
    return plans


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not); any error but "no such process" propagates."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_pids(directory: pathlib.Path, pattern: str = "*.pid") -> list[int]:
    """Pids written by fake workers' sleepers (a file still being written is skipped)."""
    texts = (p.read_text() for p in sorted(directory.glob(pattern)))
    return [int(text) for text in texts if text.strip()]


def records(record_dir: pathlib.Path) -> dict[str, dict]:
    """What each fake worker recorded, by "<type>-<index>.attempt<N>"."""
    return {p.name[: -len(".json")]: json.loads(p.read_text()) for p in record_dir.glob("*.attempt*.json")}


class Supervised:
    """The result of one supervise() call: console text, run files, and the error raised."""

    def __init__(self, console: str, run_dir: pathlib.Path, error: BaseException | None):
        self.console = console
        self.run_dir = run_dir
        self.error = error

    @property
    def run(self) -> dict:
        return json.loads((self.run_dir / "run.json").read_text())

    def log(self, name: str) -> str:
        return (self.run_dir / f"{name.replace(':', '-')}.log").read_text()

    def task(self, name: str, attempt: int = -1) -> dict:
        return self.run["attempts"][attempt]["tasks"][name]


def supervise_plans(plans, run_id: str, tmp_path: pathlib.Path, **options) -> Supervised:
    """Run supervise() with the local runner, the console going to a file."""
    from launcher.errors import MgpuError
    from launcher.backends.local import LocalBackend
    from launcher.supervise.supervisor import SuperviseOptions, supervise

    clock = options.pop("clock", time.monotonic)
    options.setdefault("grace_period", 2.0)
    # Far longer than any task here takes to start on a loaded machine: a test of the start timeout
    # gives its own, with a clock that leaps on an event (LeapingClock).
    options.setdefault("start_timeout", 600.0)
    log_dir = tmp_path / "runs"
    console_path = tmp_path / f"console-{run_id}.txt"
    runner = LocalBackend()
    error = None
    with open(console_path, "w") as console:
        try:
            supervise(plans, runner, SuperviseOptions(run_id=run_id, log_dir=log_dir, **options), console,
                      clock=clock)
        except MgpuError as e:
            error = e
    return Supervised(console_path.read_text(), log_dir / run_id, error)


class LeapingClock:
    """The monotonic clock, leaping `by` seconds ahead once `when()` holds: a deadline passes
    on an event of the test's choosing, not after so many seconds of wall time."""

    def __init__(self, when, by: float):
        self.when = when
        self.by = by
        self.leapt = False

    def __call__(self) -> float:
        holds = self.when()  # asked on every call: `when` may act on what it sees
        self.leapt = self.leapt or holds
        return time.monotonic() + (self.by if self.leapt else 0.0)


def recorded_ready(run_dir: pathlib.Path, *names: str):
    """A test of whether run.json shows these tasks ready in the current attempt."""

    def ready() -> bool:
        try:
            tasks = json.loads((run_dir / "run.json").read_text())["attempts"][-1]["tasks"]
        except (OSError, ValueError, LookupError):
            return False
        return all(tasks.get(name, {}).get("ready_at") for name in names)

    return ready


def released_once(clock_when, go_file):
    """A clock's `when` that, some looks after it first holds, creates `go_file`: the tasks waiting
    for it end only after the supervisor has watched them past the leap."""
    looks = []

    def when() -> bool:
        if looks or clock_when():
            looks.append(1)
            if len(looks) == 20:
                go_file.touch()
        return bool(looks)

    return when


def assert_run_gone(run_id: str) -> None:
    left = proctree.tagged_processes(run_id)
    assert not left, f"still running: {[(p.pid, p.cmdline()) for p in left]}"


class Runs:
    """The log dir of a test and its detached runs, whose supervisors are killed at the end if left."""

    def __init__(self, tmp_path):
        self.log_dir = tmp_path / "runs"
        self.go = tmp_path / "go"
        self.started: list[str] = []

    def mgpu(self, *args, timeout=60):
        return run_mgpu(*args, "--log-dir", str(self.log_dir), timeout=timeout)

    def launch_args(self, run_id, *worker_args, workers=2, grace=1.0):
        self.started.append(run_id)
        return ["launch", "--local", str(workers), "--run-id", run_id, "--log-dir", str(self.log_dir),
                "--grace-period", str(grace), "--", *FAKE_WORKER, *worker_args]

    def detach(self, run_id, *worker_args, **kw):
        """`mgpu launch --detach` from a shell of its own session that ends when the launch returns."""
        argv = shlex.join([*MGPU, "launch", "--detach", *self.launch_args(run_id, *worker_args, **kw)[1:]])
        shell = subprocess.run(["bash", "-c", f"{argv}; echo shell-exit=$?"], env=mgpu_env(), capture_output=True,
                               text=True, timeout=60, start_new_session=True, stdin=subprocess.DEVNULL)
        assert "shell-exit=0" in shell.stdout, shell.stdout + shell.stderr
        return shell.stdout

    def record(self, run_id):
        return json.loads((self.log_dir / run_id / "run.json").read_text())

    def status(self, run_id):
        done = self.mgpu("status", run_id, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def close(self):
        for run_id in self.started:
            try:
                pid = self.record(run_id).get("supervisor_pid")
            except (OSError, ValueError):
                continue
            if pid and pid != os.getpid() and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)  # its reaper stops the tasks


@pytest.fixture
def runs(tmp_path):
    """A test's Runs: its detached runs' supervisors are killed at the end if they were left."""
    made = Runs(tmp_path)
    yield made
    made.close()
