"""The stall watchdog with real processes: a run that stops making progress is stopped with every
task's Python stack; output or CPU use from any training task is progress."""

import json
import os
import pathlib
import sys
import time

import cpu_limits
import needs
from launcher.errors import TaskFailed
from launcher.host.py_spy import ENV_PY_SPY
from launcher.supervise.options import DEFAULT_STALL_TIMEOUT
from supervisor_helpers import (LeapingClock, assert_run_gone, make_plans, recorded_ready, released_once,
                                supervise_plans)

FAULTHANDLER = {"PYTHONFAULTHANDLER": "1"}  # the planner sets it for every task
CORE_LIMIT_TASK = pathlib.Path(__file__).parents[1] / "programs" / "core_limit_task.py"
FAKE_GPU_BIN = pathlib.Path(__file__).parents[1] / "programs" / "fake_gpu_bin"


def test_a_run_where_no_task_prints_or_computes_is_stopped_with_every_stack(run_id, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_PY_SPY, "")  # no py-spy: the stacks come from SIGABRT and faulthandler
    # The tasks' PATH has an nvidia-smi that prints a recorded `nvidia-smi -q`; mgpu's own has none.
    task_path = f"{FAKE_GPU_BIN}:{os.environ['PATH']}"
    plans = make_plans(run_id, ["--ready", "--forever"], waits_for_ready=True, env={**FAULTHANDLER, "PATH": task_path})
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=2.0, grace_period=1.0)
    assert isinstance(result.error, TaskFailed)
    lines = str(result.error).splitlines()
    assert lines[0].startswith("stall: no training task made progress for ")
    assert "likely cause" not in lines[0]  # both wait in their own code: neither is singled out
    assert "worker:0 on 127.0.0.1: in its own code, not in a collective" in lines
    assert "worker:1 on 127.0.0.1: in its own code, not in a collective" in lines
    assert any("fake_worker.py:" in line and " in main" in line for line in lines), lines
    assert lines[-2] == f"stacks: {result.run_dir / 'stacks-0.txt'}"
    assert lines[-1].startswith("hint: a program that computes for longer than 2 s without printing is not stalled")
    kept = (result.run_dir / "stacks-0.txt").read_text()
    assert "===== worker:1 on 127.0.0.1 =====" in kept and 'fake_worker.py", line' in kept
    assert "[mgpu] no progress from any training task for" in result.console
    # The dumps go to the logs; the console has the report's summary of them.
    assert "Fatal Python error" not in result.console and "Fatal Python error: Aborted" in result.log("worker:1")
    record = result.run
    assert record["status"] == "stalled" and record["attempts"][0]["outcome"] == "stalled"
    assert {t["signal"] for t in record["attempts"][0]["tasks"].values()} == {"SIGABRT"}
    # Both tasks are on one host: one query, kept under the host's name, named in the README.
    assert [p.name for p in (result.run_dir / "stall-0" / "nvidia-smi").iterdir()] == ["127.0.0.1.txt"]
    kept = (result.run_dir / "stall-0" / "nvidia-smi" / "127.0.0.1.txt").read_text()
    assert kept == (FAKE_GPU_BIN / "nvidia_smi_q.txt").read_text()
    assert "nvidia-smi/" in (result.run_dir / "stall-0" / "README").read_text()
    assert_run_gone(run_id)


class TickClock:
    """Leaps `by` seconds each time worker:0's log has a new tick line, from when both tasks are
    ready; after `leaps` leaps, creates `go_file` so that the tasks end."""

    def __init__(self, run_dir, by, leaps, go_file):
        self.ready = recorded_ready(run_dir, "worker:0", "worker:1")
        self.log = run_dir / "worker-0.log"
        self.by, self.leaps, self.go_file = by, leaps, go_file
        self.offset, self.ticks_seen, self.leapt = 0.0, None, 0

    def __call__(self):
        if self.leapt < self.leaps and self.log.exists() and self.ready():
            ticks = self.log.read_text().count("tick")
            if self.ticks_seen is not None and ticks > self.ticks_seen:
                self.offset += self.by
                self.leapt += 1
                if self.leapt == self.leaps:
                    self.go_file.touch()
            self.ticks_seen = ticks
        return time.monotonic() + self.offset


def test_output_from_any_training_task_is_progress(run_id, tmp_path):
    # worker:1 is silent, worker:0 prints; the clock leaps 60 s at each of its lines, five times: the
    # job is 300 s past a 100 s stall timeout, not stalled.
    go = tmp_path / "go"
    plans = make_plans(run_id, ["--ready", "--tick", "worker:0", "--until-file", str(go)], waits_for_ready=True,
                       env=FAULTHANDLER)
    clock = TickClock(tmp_path / "runs" / run_id, by=60, leaps=5, go_file=go)
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=100, clock=clock)
    assert result.error is None, result.error
    assert result.run["status"] == "succeeded"
    assert clock.leapt == 5


def test_cpu_use_is_progress(run_id, tmp_path):
    """worker:1 computes silently for longer than the stall timeout (a long evaluation, say) while
    worker:0 waits silently for it: the CPU use of one task is the job's progress. They (and the
    supervisor, in this process) run with the weight of processes under test
    (cpu_limits.PRIORITY_WEIGHT): other work on a loaded machine could otherwise leave a busy task
    less than the progress share of a core for a whole timeout."""
    plans = make_plans(run_id, ["--ready", "--busy", "worker:1", "--sleep", "5"], waits_for_ready=True,
                       env=FAULTHANDLER)
    with cpu_limits.cpu_weight(cpu_limits.PRIORITY_WEIGHT) as favoured:
        favoured.add(os.getpid())  # the tasks it starts are in the group too
        result = supervise_plans(plans, run_id, tmp_path, stall_timeout=2.0)
    assert result.error is None, result.error


def test_a_stall_is_a_failure_that_restarts_apply_to(run_id, tmp_path):
    plans = make_plans(run_id, ["--ready", "--forever", "--sleep-on", "all@1=0"], waits_for_ready=True,
                       env=FAULTHANDLER)
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=1.5, max_restarts=1, grace_period=1.0)
    assert result.error is None, result.error
    assert [a["outcome"] for a in result.run["attempts"]] == ["stalled", "succeeded"]
    assert (result.run_dir / "stacks-0.txt").exists()
    assert "[mgpu] restarting all tasks (restart 1 of 1)" in result.console


def test_no_stall_watchdog_with_zero(run_id, tmp_path):
    # Silent tasks, and a clock that leaps past the default stall timeout once they are ready.
    go = tmp_path / "go"
    plans = make_plans(run_id, ["--ready", "--until-file", str(go)], waits_for_ready=True, env=FAULTHANDLER)
    ready = recorded_ready(tmp_path / "runs" / run_id, "worker:0", "worker:1")
    clock = LeapingClock(released_once(ready, go), by=10 * DEFAULT_STALL_TIMEOUT)
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=0.0, clock=clock)
    assert result.error is None, result.error
    assert json.loads((result.run_dir / "run.json").read_text())["options"]["stall_timeout"] == 0.0


def test_the_stall_timeout_comes_from_the_command_line_then_the_spec_then_the_default(tmp_path):
    import os

    from launcher.host.ports import pick_free_ports
    from launching import run_mgpu

    spec = tmp_path / "cluster.yaml"
    spec.write_text(f"cluster: {{worker: ['127.0.0.1:{pick_free_ports(1)[0]}']}}\nstall_timeout: 7\n")

    runs = iter(range(3))

    def recorded(*args):
        run_id = f"stall-option-{os.getpid()}-{next(runs)}"
        done = run_mgpu("launch", "--spec", str(spec), *args, "--log-dir", str(tmp_path), "--run-id", run_id,
                        "--", "true")
        assert done.returncode == 0, done.stderr
        return json.loads((tmp_path / run_id / "run.json").read_text())["options"]["stall_timeout"]

    assert recorded() == 7.0
    assert recorded("--stall-timeout", "0") == 0.0
    spec.write_text(spec.read_text().replace("stall_timeout: 7\n", ""))
    assert recorded("--log-dir", str(tmp_path)) == 1800.0


def test_asking_a_stalled_task_for_its_stacks_leaves_no_core_file(run_id, tmp_path, monkeypatch):
    """With core dumps on (`ulimit -c unlimited`), the SIGABRT that asks for stacks would leave a core
    file of every process of the task in its folder: mgpu lowers their core limit to 0 first. A
    child shell of the task reads its own limit as the signal arrives (what the kernel applies,
    wherever its core_pattern sends cores); its `sleep` and the Python task itself would dump cores
    (tests/programs/core_limit_task.py)."""
    monkeypatch.setenv(ENV_PY_SPY, "")  # SIGABRT, the way left where py-spy cannot read the task
    work = tmp_path / "work"
    work.mkdir()
    plans = [p.__class__(**{**p.__dict__, "argv": (sys.executable, str(CORE_LIMIT_TASK)), "workdir": str(work)})
             for p in make_plans(run_id, [], workers=1, waits_for_ready=True, env=FAULTHANDLER)]
    ready = recorded_ready(tmp_path / "runs" / run_id, "worker:0")
    clock = LeapingClock(ready, by=1000)  # ready: its child's trap is set
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=100, grace_period=1.0, clock=clock)
    assert str(result.error).startswith("stall: "), result.error
    assert "Fatal Python error: Aborted" in result.log("worker:0")
    limits = (work / "limits-0.txt").read_text().split()
    assert limits[4] == "0", limits  # Max core file size <soft> <hard> bytes
    assert not [p.name for p in work.iterdir() if p.name.startswith("core")]
    assert_run_gone(run_id)


def test_a_stall_reads_every_stack_with_py_spy_before_the_stop_and_keeps_them_in_its_folder(run_id, tmp_path):
    """py-spy reads the stalled tasks' stacks while they run: no SIGABRT, no faulthandler dump; the
    report says where each task was from them, and where the stall's folder is."""
    needs.installed_version("py-spy")
    plans = make_plans(run_id, ["--ready", "--forever"], waits_for_ready=True, env=FAULTHANDLER)
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=2.0, grace_period=1.0)
    lines = str(result.error).splitlines()
    assert lines[0].startswith("stall: no training task made progress for "), lines
    assert "worker:1 on 127.0.0.1: in its own code, not in a collective" in lines
    assert any("fake_worker.py:" in line and " in main" in line for line in lines), lines
    assert lines[-3] == f"evidence: {result.run_dir / 'stall-0'}/ (its README says what is there)"
    assert lines[-2] == f"stacks: {result.run_dir / 'stacks-0.txt'}"
    kept = (result.run_dir / "stall-0" / "stacks.txt").read_text()
    assert kept.count("(read by py-spy, the task running)") == 2 and "[native]" in kept
    assert (result.run_dir / "stacks-0.txt").read_text() == kept
    assert "stacks.txt" in (result.run_dir / "stall-0" / "README").read_text()
    assert "collecting every task's stacks (py-spy; SIGABRT where it cannot attach)" in result.console
    for name in ("worker:0", "worker:1"):
        assert "Fatal Python error" not in result.log(name)
    # Stopped by the stop's SIGTERM, not asked for stacks with SIGABRT.
    assert {t["signal"] for t in result.run["attempts"][0]["tasks"].values()} == {"SIGTERM"}
    assert_run_gone(run_id)


def test_a_py_spy_that_fails_leaves_the_stacks_to_sigabrt_and_the_stop_goes_on(run_id, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_PY_SPY, "/bin/false")  # a py-spy that reads nothing
    plans = make_plans(run_id, ["--ready", "--forever"], waits_for_ready=True, env=FAULTHANDLER)
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=2.0, grace_period=1.0)
    lines = str(result.error).splitlines()
    assert "worker:1 on 127.0.0.1: in its own code, not in a collective" in lines
    for name in ("worker:0", "worker:1"):
        assert f"[mgpu] {name} on 127.0.0.1: py-spy could not read pid " in result.console
        assert f"asking {name} with SIGABRT" in result.console
        assert "Fatal Python error: Aborted" in result.log(name)
    kept = (result.run_dir / "stall-0" / "stacks.txt").read_text()
    assert "py-spy could not read pid" in kept and 'fake_worker.py", line' in kept
    assert {t["signal"] for t in result.run["attempts"][0]["tasks"].values()} == {"SIGABRT"}
    assert_run_gone(run_id)
