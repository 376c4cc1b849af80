"""supervise() with fake workers up to training: the run id and its folder, ports, tasks ready or not by the start deadline."""

import os
import socket
import stat
import subprocess
import sys

import pytest

from launcher import protocol
from launcher.host import proctree
from launcher.errors import TaskFailed, UsageError
from launcher.launch import launch
from launcher.launch_options import LaunchOptions
from launcher.supervise.options import SuperviseOptions
from launching import wait_for
from supervisor_helpers import (LeapingClock, assert_run_gone, make_plans, records, recorded_ready, released_once,
                                supervise_plans)

pytestmark = pytest.mark.timeout(60)


def test_start_timeout_names_the_missing_task(run_id, tmp_path):
    # worker:1 never prints the ready line; the start deadline passes once worker:0 is ready.
    plans = make_plans(run_id, ["--ready", "--no-ready", "worker:1", "--forever"], waits_for_ready=True)
    clock = LeapingClock(recorded_ready(tmp_path / "runs" / run_id, "worker:0"), by=1000)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=10.0, grace_period=0.5, clock=clock)
    assert isinstance(result.error, TaskFailed)
    assert str(result.error).startswith("start timeout: worker:1 not ready after 10 s\n")
    run = result.run
    assert run["status"] == "start-timeout"
    assert run["attempts"][0]["outcome"] == "start-timeout"
    assert run["attempts"][0]["tasks"]["worker:0"]["ready_at"] is not None
    assert run["attempts"][0]["tasks"]["worker:1"]["ready_at"] is None
    assert_run_gone(run_id)


def test_ready_tasks_pass_the_start_deadline(run_id, tmp_path):
    go = tmp_path / "go"
    plans = make_plans(run_id, ["--ready", "--until-file", str(go)], waits_for_ready=True)
    ready = recorded_ready(tmp_path / "runs" / run_id, "worker:0", "worker:1")
    clock = LeapingClock(released_once(ready, go), by=1000)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=10.0, clock=clock)
    assert result.error is None
    assert all(t["ready_at"] for t in result.run["attempts"][0]["tasks"].values())
    assert "all 2 tasks ready after" in result.console
    assert protocol.READY_LINE not in result.console  # announced once by the launcher instead
    assert protocol.READY_LINE in (result.run_dir / "worker-0.log").read_text()


def test_port_taken_before_launch(run_id, tmp_path):
    plans = make_plans(run_id, [])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", plans[1].port))
        holder.listen()
        result = supervise_plans(plans, run_id, tmp_path)
    assert str(result.error) == f"port in use: 127.0.0.1:{plans[1].port} (planned for worker:1)"
    assert result.run["status"] == "failed" and result.run["attempts"] == []


def test_port_taken_while_starting_is_named_in_the_summary(run_id, tmp_path):
    plans = make_plans(run_id, ["--bind", "--steal-port", "worker:0=worker:1", "--forever"])
    port = plans[1].port
    result = supervise_plans(plans, run_id, tmp_path)
    assert str(result.error).startswith(f"worker:1 on 127.0.0.1 exited with code 1: port in use: 127.0.0.1:{port}\n")


def test_a_run_id_cannot_be_reused(run_id, tmp_path):
    plans = make_plans(run_id, [], workers=1)
    assert supervise_plans(plans, run_id, tmp_path).error is None
    again = supervise_plans(plans, run_id, tmp_path)
    assert isinstance(again.error, UsageError) and "already exists" in str(again.error)


def test_a_run_id_carried_by_live_processes_is_refused_before_anything_starts(run_id, record_dir, tmp_path):
    # Another run's task with this run id, in another log dir: stopping this run would stop it too.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "MGPU_RUN_ID": run_id}, start_new_session=True)
    try:
        wait_for(lambda: [p.pid for p in proctree.tagged_processes(run_id)] == [other.pid], 10,
                 what="only the other process tagged")
        plans = make_plans(run_id, ["--record", str(record_dir)], workers=1)
        options = LaunchOptions(SuperviseOptions(run_id=run_id, log_dir=tmp_path / "runs"), check_hosts=False)
        with pytest.raises(UsageError) as refused:
            launch(plans, options)
        assert refused.value.exit_code == 2
        assert str(refused.value) == (f"run id {run_id} is in use by running processes (pid {other.pid}); "
                                      f"choose another run id")
        assert not (tmp_path / "runs" / run_id).exists()
        assert records(record_dir) == {}
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_run_dir_is_private_whatever_the_umask(run_id, tmp_path):
    previous = os.umask(0)
    try:
        result = supervise_plans(make_plans(run_id, ["--lines", "1"], workers=1), run_id, tmp_path)
    finally:
        os.umask(previous)
    assert result.error is None
    assert stat.S_IMODE(result.run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(result.run_dir.parent.stat().st_mode) == 0o755  # not 0777: nobody else may rename in it
    assert {p.name for p in result.run_dir.iterdir()} >= {"run.json", "worker-0.log", "reaper.log"}
    assert {stat.S_IMODE(p.stat().st_mode) for p in result.run_dir.iterdir()} == {0o600}


def test_an_existing_run_dir_is_never_reused(run_id, tmp_path):
    # Someone else's folder (or one left by a run that died early) must not receive run.json.
    existing = tmp_path / "runs" / run_id
    existing.mkdir(parents=True, mode=0o755)
    result = supervise_plans(make_plans(run_id, [], workers=1), run_id, tmp_path)
    assert isinstance(result.error, UsageError) and result.error.exit_code == 2
    assert str(result.error) == f"run {run_id} already exists in {existing}; choose another run id"
    assert list(existing.iterdir()) == [] and stat.S_IMODE(existing.stat().st_mode) == 0o755


def test_a_log_dir_that_cannot_be_made_is_a_usage_error(run_id, tmp_path):
    from launcher.backends.local import LocalBackend
    from launcher.supervise.supervisor import SuperviseOptions, supervise

    (tmp_path / "file").write_text("")
    options = SuperviseOptions(run_id=run_id, log_dir=tmp_path / "file" / "runs")
    with pytest.raises(UsageError, match=f"^--log-dir {tmp_path / 'file' / 'runs'}: Not a directory$"):
        supervise(make_plans(run_id, [], workers=1), LocalBackend(), options)


def test_an_evaluator_that_never_gets_ready_does_not_time_out_the_start(run_id, tmp_path):
    go = tmp_path / "go"
    plans = make_plans(run_id, ["--ready", "--no-ready", "evaluator", "--until-file", str(go)], evaluator=True,
                       waits_for_ready=True)
    ready = recorded_ready(tmp_path / "runs" / run_id, "worker:0", "worker:1")
    clock = LeapingClock(released_once(ready, go), by=1000)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=10.0, clock=clock)
    assert result.error is None
    assert result.run["status"] == "succeeded"
    assert result.task("evaluator:0")["ready_at"] is None and result.task("evaluator:0")["exit_code"] == 0


def test_a_task_that_cannot_start_stops_the_ones_already_started(run_id, tmp_path):
    plans = make_plans(run_id, ["--forever"])
    plans[1] = type(plans[1])(**{**plans[1].__dict__, "argv": ("/nonexistent/mgpu-test-program",)})
    result = supervise_plans(plans, run_id, tmp_path, grace_period=0.5)
    assert isinstance(result.error, TaskFailed)
    assert str(result.error).startswith("worker:1: cannot start '/nonexistent/mgpu-test-program'")
    assert result.run["status"] == "failed"
    assert result.task("worker:0")["signal"] == "SIGTERM"
    assert_run_gone(run_id)


# -- programs without the ready line: started once they listen ---------------------------------


def test_a_program_without_the_ready_line_is_ready_once_it_listens(run_id, tmp_path):
    # Both tasks listen on their TF_CONFIG port and run until the record shows them ready.
    go = tmp_path / "go"
    plans = make_plans(run_id, ["--bind", "--until-file", str(go)])
    clock = LeapingClock(released_once(recorded_ready(tmp_path / "runs" / run_id, "worker:0", "worker:1"), go), by=0)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=120, clock=clock)
    assert result.error is None, result.error
    assert all(t["ready_at"] for t in result.run["attempts"][0]["tasks"].values())
    assert "[mgpu] all 2 tasks ready after" in result.console


def test_jax_and_torch_style_tasks_are_ready_once_they_hold_a_connection_to_the_coordinator(run_id, tmp_path):
    # Only process 0 listens; process 1 dials it and listens on nothing. Both run until seen ready.
    go = tmp_path / "go"
    plans = make_plans(run_id, ["--bind", "--no-bind", "worker:1", "--dial", "worker:1", "--until-file", str(go)])
    clock = LeapingClock(released_once(recorded_ready(tmp_path / "runs" / run_id, "worker:0", "worker:1"), go), by=0)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=120, clock=clock)
    assert result.error is None, result.error
    tasks = result.run["attempts"][0]["tasks"]
    assert all(t["ready_at"] and t["ready_at"] < t["ended_at"] for t in tasks.values()), tasks
    assert "[mgpu] all 2 tasks ready after" in result.console


def test_tasks_that_end_before_joining_are_not_announced_ready(run_id, tmp_path):
    plans = make_plans(run_id, ["--sleep", "0"])  # no port listened on, no connection: never seen joined
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=30)
    assert result.error is None, result.error
    assert all(t["ready_at"] for t in result.run["attempts"][0]["tasks"].values())
    assert "tasks ready" not in result.console


def test_a_program_that_never_listens_hits_the_start_timeout(run_id, tmp_path):
    plans = make_plans(run_id, ["--bind", "--no-bind", "worker:1", "--lines", "2", "--forever"])
    run_dir = tmp_path / "runs" / run_id
    worker_0_joined = recorded_ready(run_dir, "worker:0")

    def printed_and_joined() -> bool:  # the deadline passes once worker:1 printed its lines, worker:0 joined
        log = run_dir / "worker-1.log"
        return worker_0_joined() and log.exists() and log.read_text().count("worker:1 1") == 2

    clock = LeapingClock(printed_and_joined, by=1000)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=2.5, grace_period=0.5, clock=clock)
    assert isinstance(result.error, TaskFailed)
    lines = str(result.error).splitlines()
    assert lines[0] == "start timeout: worker:1 not ready after 2.5 s"
    assert lines[1] == (f"worker:1 on 127.0.0.1 never joined: it neither listened on port {plans[1].port} nor "
                        f"connected to the coordinator's port {plans[0].port} (log: {result.run_dir / 'worker-1.log'})")
    assert lines[2] == "  it printed last:"
    printed = {f"    {stream} worker:1 {i}" for stream in ("out", "err") for i in (0, 1)}
    assert len(lines[3:]) == 3 and set(lines[3:]) < printed  # the two streams interleave in any order
    tasks = result.run["attempts"][0]["tasks"]
    assert tasks["worker:0"]["ready_at"] and tasks["worker:1"]["ready_at"] is None
    assert result.run["status"] == "start-timeout"
    assert_run_gone(run_id)
