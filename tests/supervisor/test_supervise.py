"""supervise() driven directly with plans, the local runner and fake workers."""

import json
import re
import socket

import pytest

from launcher import protocol
from launcher.errors import TaskFailed, UsageError
from supervisor_helpers import assert_run_gone, make_plans, pid_alive, read_pids, records, supervise_plans

pytestmark = pytest.mark.timeout(60)


def test_success_gives_each_task_its_tf_config_and_records_everything(run_id, record_dir, tmp_path):
    plans = make_plans(run_id, ["--record", str(record_dir), "--lines", "3"], workers=2, chief=True, evaluator=True)
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None

    recs = records(record_dir)
    assert sorted(recs) == ["chief-0.attempt0", "evaluator-0.attempt0", "worker-0.attempt0", "worker-1.attempt0"]
    cluster = plans[0].tf_config["cluster"]
    assert cluster == {"chief": [f"127.0.0.1:{plans[0].port}"],
                       "worker": [f"127.0.0.1:{plans[1].port}", f"127.0.0.1:{plans[2].port}"]}
    for plan in plans:
        env = recs[f"{plan.type}-{plan.index}.attempt0"]["env"]
        assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster, "task": {"type": plan.type, "index": plan.index}}
        assert env["MGPU_ATTEMPT"] == "0"

    # Console: every line whole and prefixed; logs: both streams, unprefixed.
    for plan in plans:
        for i in range(3):
            assert f"[{plan.name}] out {plan.name} {i}\n" in result.console
            assert f"[{plan.name}] err {plan.name} {i}\n" in result.console
        log = result.log(plan.name)
        assert f"out {plan.name} 2\n" in log and f"err {plan.name} 2\n" in log and "[" not in log
    for line in result.console.splitlines():
        assert re.match(r"\[(chief:0|worker:[01]|evaluator:0|mgpu)\] ", line), line

    run = result.run
    assert run["status"] == "succeeded" and run["message"] is None and run["ended_at"]
    assert [p["name"] for p in run["plans"]] == ["chief:0", "worker:0", "worker:1", "evaluator:0"]
    assert run["plans"][1]["env"]["TF_CONFIG"] == plans[1].env["TF_CONFIG"]
    [attempt] = run["attempts"]
    assert attempt["attempt"] == 0 and attempt["outcome"] == "succeeded"
    for plan in plans:
        task = attempt["tasks"][plan.name]
        assert task["host"] == "127.0.0.1"
        assert task["pid"] == recs[f"{plan.type}-{plan.index}.attempt0"]["pid"]
        assert task["exit_code"] == 0 and task["signal"] is None
        assert task["started_at"] <= task["ended_at"]
    assert_run_gone(run_id)


def test_first_failure_stops_every_other_task_and_its_grandchildren(run_id, record_dir, tmp_path):
    plans = make_plans(run_id, ["--record", str(record_dir), "--forever", "--lines", "30",
                                "--fail", "worker:1=3", "--sleep-on", "worker:1=0.5",
                                "--grandchild", "all", "--setsid-grandchild", "all"], workers=2, chief=True)
    result = supervise_plans(plans, run_id, tmp_path)

    assert isinstance(result.error, TaskFailed) and result.error.exit_code == 1
    message = str(result.error)
    first, second, *tail = message.splitlines()
    assert first == "worker:1 on 127.0.0.1 exited with code 3"
    assert second == f"last 20 lines of {result.run_dir / 'worker-1.log'}:"
    assert len(tail) == 20 and tail[-1] == "  worker:1 attempt 0 exiting with 3"
    assert "[mgpu] worker:1 exited with code 3; stopping all tasks" in result.console

    run = result.run
    assert run["status"] == "failed" and run["message"] == message
    assert result.task("worker:1")["exit_code"] == 3
    for name in ("chief:0", "worker:0"):
        assert result.task(name)["signal"] == "SIGTERM" and result.task(name)["exit_code"] is None
    grandchildren = read_pids(record_dir)
    assert len(grandchildren) == 6
    assert not any(pid_alive(pid) for pid in grandchildren)
    assert_run_gone(run_id)


def test_task_ignoring_term_is_killed_after_the_grace_period(run_id, tmp_path):
    plans = make_plans(run_id, ["--forever", "--ignore-term", "worker:0", "--fail", "worker:1=1",
                                "--sleep-on", "worker:1=0.3"])
    result = supervise_plans(plans, run_id, tmp_path, grace_period=0.5)
    assert isinstance(result.error, TaskFailed)
    assert result.task("worker:0")["signal"] == "SIGKILL"
    assert "[mgpu] grace period over; killing worker:0" in result.console
    assert_run_gone(run_id)


def test_death_by_signal_is_a_failure(run_id, tmp_path):
    plans = make_plans(run_id, ["--forever"], workers=1)
    plans[0] = type(plans[0])(**{**plans[0].__dict__, "argv": ("sh", "-c", "kill -9 $$")})
    result = supervise_plans(plans, run_id, tmp_path)
    assert str(result.error).startswith("worker:0 on 127.0.0.1 was killed by SIGKILL\nno output")
    assert result.task("worker:0")["signal"] == "SIGKILL"


def test_restart_succeeds_on_the_second_attempt(run_id, record_dir, tmp_path):
    plans = make_plans(run_id, ["--record", str(record_dir), "--fail", "worker:1@0=3", "--sleep", "0.3"])
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=2)
    assert result.error is None
    run = result.run
    assert run["status"] == "succeeded"
    assert [(a["attempt"], a["outcome"]) for a in run["attempts"]] == [(0, "failed"), (1, "succeeded")]
    assert run["attempts"][0]["tasks"]["worker:1"]["exit_code"] == 3
    assert run["attempts"][1]["tasks"]["worker:1"]["exit_code"] == 0
    assert run["attempts"][0]["tasks"]["worker:0"]["pid"] != run["attempts"][1]["tasks"]["worker:0"]["pid"]
    assert "[mgpu] restarting all tasks (restart 1 of 2)" in result.console
    assert records(record_dir)["worker:0".replace(":", "-") + ".attempt1"]["env"]["MGPU_ATTEMPT"] == "1"
    log = result.log("worker:1")
    assert log.index("worker:1 attempt 0 exiting with 3") < log.index("----- mgpu: attempt 1 started")
    assert log.index("----- mgpu: attempt 1") < log.index("worker:1 attempt 1 exiting with 0")


def test_restarts_run_out(run_id, tmp_path):
    plans = make_plans(run_id, ["--fail", "worker:0=5"])
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=1)
    assert str(result.error).startswith("worker:0 on 127.0.0.1 exited with code 5, after 1 restart\n")
    assert [a["outcome"] for a in result.run["attempts"]] == ["failed", "failed"]
    assert result.run["status"] == "failed"


def test_preemption_restarts_without_using_max_restarts_but_is_bounded(run_id, tmp_path):
    code = str(protocol.EXIT_PREEMPTED)
    plans = make_plans(run_id, ["--fail", f"worker:0@0={code}", "--fail", f"worker:0@1={code}"])
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=0)
    assert result.error is None
    assert [a["outcome"] for a in result.run["attempts"]] == ["failed", "failed", "succeeded"]
    assert "[mgpu] restarting all tasks after preemption (1 of at most 100)" in result.console

    plans = make_plans(run_id + "b", ["--fail", f"worker:0={code}"])
    result = supervise_plans(plans, run_id + "b", tmp_path, max_preemption_restarts=2)
    assert str(result.error).startswith(f"worker:0 on 127.0.0.1 exited with code {code} (preempted), after 2 restarts\n")
    assert len(result.run["attempts"]) == 3


def test_start_timeout_names_the_missing_task(run_id, tmp_path):
    plans = make_plans(run_id, ["--ready", "--no-ready", "worker:1", "--forever"], waits_for_ready=True)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=1.0, grace_period=0.5)
    assert isinstance(result.error, TaskFailed)
    assert str(result.error).startswith("start timeout: worker:1 not ready after 1 s\n")
    run = result.run
    assert run["status"] == "start-timeout"
    assert run["attempts"][0]["outcome"] == "start-timeout"
    assert run["attempts"][0]["tasks"]["worker:0"]["ready_at"] is not None
    assert run["attempts"][0]["tasks"]["worker:1"]["ready_at"] is None
    assert_run_gone(run_id)


def test_ready_tasks_pass_the_start_deadline(run_id, tmp_path):
    plans = make_plans(run_id, ["--ready", "--sleep", "1.5"], waits_for_ready=True)
    result = supervise_plans(plans, run_id, tmp_path, start_timeout=1.0)
    assert result.error is None
    assert all(t["ready_at"] for t in result.run["attempts"][0]["tasks"].values())
    assert "all 2 tasks ready after" in result.console
    assert protocol.READY_LINE not in result.console  # announced once by the launcher instead
    assert protocol.READY_LINE in (result.run_dir / "worker-0.log").read_text()


def test_fifty_megabytes_of_output_do_not_block(run_id, tmp_path):
    plans = make_plans(run_id, ["--print-mb", "50", "--lines", "2"])
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None
    for plan in plans:
        log_size = (result.run_dir / f"worker-{plan.index}.log").stat().st_size
        assert log_size >= 50 * 1024 * 1024
        assert f"{plan.name} printed 50.0 MB" in result.log(plan.name)


def test_long_line_without_newline_is_shown_in_pieces(run_id, tmp_path):
    plans = make_plans(run_id, [], workers=1)
    script = "import sys; sys.stdout.write('y' * 200000); sys.stderr.write('tail\\n')"
    plans[0] = type(plans[0])(**{**plans[0].__dict__, "argv": (plans[0].argv[0], "-c", script)})
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None
    log = result.log("worker:0")
    assert log.count("y") == 200000
    assert "tail" in log.splitlines()  # never mixed into a piece of the long line
    assert result.console.count("[worker:0] yyy") >= 3


def test_show_filters_the_console_only(run_id, tmp_path):
    plans = make_plans(run_id, ["--lines", "2"], chief=True)
    result = supervise_plans(plans, run_id, tmp_path, show=frozenset({"worker:1", "chief"}))
    assert "[worker:1] out worker:1 1" in result.console
    assert "[chief:0] out chief:0 1" in result.console
    assert "[worker:0]" not in result.console
    assert "out worker:0 1" in result.log("worker:0")


def test_timestamps(run_id, tmp_path):
    plans = make_plans(run_id, ["--lines", "1"], workers=1)
    result = supervise_plans(plans, run_id, tmp_path, timestamps=True)
    assert re.search(r"^\d\d:\d\d:\d\d\.\d\d\d \[worker:0\] out worker:0 0$", result.console, re.M)
    assert "out worker:0 0\n" in result.log("worker:0")


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


def test_a_task_that_cannot_start_stops_the_ones_already_started(run_id, tmp_path):
    plans = make_plans(run_id, ["--forever"])
    plans[1] = type(plans[1])(**{**plans[1].__dict__, "argv": ("/nonexistent/mgpu-test-program",)})
    result = supervise_plans(plans, run_id, tmp_path, grace_period=0.5)
    assert isinstance(result.error, TaskFailed)
    assert str(result.error).startswith("worker:1: cannot start '/nonexistent/mgpu-test-program'")
    assert result.run["status"] == "failed"
    assert result.task("worker:0")["signal"] == "SIGTERM"
    assert_run_gone(run_id)
