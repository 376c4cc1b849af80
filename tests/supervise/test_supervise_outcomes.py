"""supervise() with fake workers as the run goes and ends: its record and output, failures, restarts, evaluators."""

import json
import os
import re
import signal
import threading

import psutil
import pytest

from launcher import protocol
from launcher.errors import TaskFailed
from launching import wait_for
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

    closing = result.console.splitlines()[-1]
    assert re.fullmatch(r"\[mgpu\] done: 4 tasks succeeded in \d+\.\d s, no restarts; "
                        r"logs and run.json in " + re.escape(str(result.run_dir)) + "/", closing), closing
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


def test_task_ignoring_term_is_killed_after_the_grace_period(run_id, record_dir, tmp_path):
    # worker:1 fails once worker:0 ignores TERM: its record is written after that.
    plans = make_plans(run_id, ["--forever", "--ignore-term", "worker:0", "--fail", "worker:1=1",
                                "--sleep-on", "worker:1=0", "--record", str(record_dir),
                                "--after-file", f"worker:1={record_dir}/worker-0.attempt0.json"])
    result = supervise_plans(plans, run_id, tmp_path, grace_period=0.5)
    assert isinstance(result.error, TaskFailed)
    assert result.task("worker:0")["signal"] == "SIGKILL"
    assert "[mgpu] grace period over; killing worker:0" in result.console
    assert_run_gone(run_id)


def test_a_stopped_task_ends_on_the_stops_sigterm_without_waiting_out_the_grace_period(run_id, record_dir, tmp_path):
    # worker:0 is stopped (SIGSTOP, as by Ctrl-Z or a debugger); then worker:1 fails, and the attempt stops.
    go = tmp_path / "worker-0-stopped"
    plans = make_plans(run_id, ["--forever", "--fail", "worker:1=1", "--sleep-on", "worker:1=0", "--record",
                                str(record_dir), "--after-file", f"worker:1={go}"])

    stopped = []

    def stop_worker_0():
        wait_for(lambda: "worker-0.attempt0" in records(record_dir), 60, what="worker:0's record")
        pid = records(record_dir)["worker-0.attempt0"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 10, what="worker:0 stopped")
        stopped.append(pid)
        go.touch()

    stopper = threading.Thread(target=stop_worker_0)
    stopper.start()
    result = supervise_plans(plans, run_id, tmp_path, grace_period=120)
    stopper.join()
    assert stopped, "worker:0 was not stopped"
    assert isinstance(result.error, TaskFailed)
    assert result.task("worker:0")["signal"] == "SIGTERM", result.console
    assert "grace period over" not in result.console
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
    closing = result.console.splitlines()[-1]
    assert re.fullmatch(r"\[mgpu\] done: 2 tasks succeeded in \d+\.\d s; 1 restart \(worker:1 failed at \d\d:\d\d: "
                        r"exited with code 3\); goodput unknown \(no steps reported\); \d+\.\d s lost[^;]*; "
                        r"logs and run.json in " + re.escape(str(result.run_dir)) + "/", closing), closing
    assert records(record_dir)["worker:0".replace(":", "-") + ".attempt1"]["env"]["MGPU_ATTEMPT"] == "1"
    log = result.log("worker:1")
    assert log.index("worker:1 attempt 0 exiting with 3") < log.index("----- mgpu: attempt 2 started")
    assert log.index("----- mgpu: attempt 2") < log.index("worker:1 attempt 1 exiting with 0")


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


def test_sixteen_megabytes_of_output_do_not_block(run_id, tmp_path):
    # 256 times what a pipe holds, from each of two tasks at once.
    plans = make_plans(run_id, ["--print-mb", "16", "--lines", "2"])
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None
    for plan in plans:
        log_size = (result.run_dir / f"worker-{plan.index}.log").stat().st_size
        assert log_size >= 16 * 1024 * 1024
        assert f"{plan.name} printed 16.0 MB" in result.log(plan.name)


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


def test_output_held_open_by_a_process_outside_the_run_is_closed_after_one_deadline(run_id, record_dir, tmp_path):
    plans = make_plans(run_id, ["--record", str(record_dir), "--escaped-holder", "all", "--lines", "1"])
    try:
        result = supervise_plans(plans, run_id, tmp_path)
        holders = read_pids(record_dir, "*.escaped.pid")
        assert len(holders) == 2 and all(pid_alive(pid) for pid in holders)  # they escaped the stop
        assert result.error is None
        assert "[mgpu] output of worker:0, worker:1 still open after stop; not waiting for it\n" in result.console
        assert "out worker:1 0" in result.log("worker:1")
        # The launcher let go of the pipes, and no reader thread is left waiting on them.
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for pid in holders for fd in (1, 2)}
        assert len(held) == 4 and all(link.startswith("pipe:") for link in held)
        assert not held & open_files_of_this_process()
        wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("mgpu-read-worker:")], 5,
                 what="the output readers to end")
    finally:
        for pid in read_pids(record_dir, "*.escaped.pid"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def open_files_of_this_process() -> set[str]:
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own fd, already closed
            pass
    return links


def test_a_failed_evaluator_does_not_stop_or_restart_training(run_id, tmp_path):
    plans = make_plans(run_id, ["--sleep", "1", "--fail", "evaluator=3", "--sleep-on", "evaluator=0"],
                       chief=True, evaluator=True)
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=2)
    assert result.error is None
    assert "[mgpu] evaluator:0 exited with code 3; training goes on without it\n" in result.console
    assert "stopping all tasks" not in result.console and "restarting" not in result.console
    run = result.run
    assert run["status"] == "succeeded" and len(run["attempts"]) == 1
    assert run["attempts"][0]["outcome"] == "succeeded"
    evaluator = result.task("evaluator:0")
    assert evaluator["exit_code"] == 3 and evaluator["failure_ignored"] is True
    for name in ("chief:0", "worker:0", "worker:1"):
        assert result.task(name)["exit_code"] == 0 and result.task(name)["failure_ignored"] is False


def test_an_evaluator_killed_by_a_signal_does_not_stop_training(run_id, tmp_path):
    plans = make_plans(run_id, ["--sleep", "1"], evaluator=True)
    plans[-1] = type(plans[-1])(**{**plans[-1].__dict__, "argv": ("sh", "-c", "kill -9 $$")})
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None
    assert "[mgpu] evaluator:0 was killed by SIGKILL; training goes on without it\n" in result.console
    assert result.task("evaluator:0")["signal"] == "SIGKILL" and result.task("evaluator:0")["failure_ignored"]
    assert result.run["status"] == "succeeded"


def test_the_run_waits_for_the_evaluator_once_training_is_done(run_id, tmp_path):
    plans = make_plans(run_id, ["--sleep-on", "evaluator=2"], evaluator=True)
    result = supervise_plans(plans, run_id, tmp_path, grace_period=30)
    assert result.error is None
    assert result.task("evaluator:0")["exit_code"] == 0  # it finished by itself, was not stopped
    assert result.task("evaluator:0")["ended_at"] > max(result.task(f"worker:{i}")["ended_at"] for i in (0, 1))
    assert "evaluator:0 attempt 0 exiting with 0" in result.log("evaluator:0")


def test_a_training_failure_still_stops_the_evaluator(run_id, tmp_path):
    plans = make_plans(run_id, ["--forever", "--fail", "worker:1=4", "--sleep-on", "worker:1=0.3"], evaluator=True)
    result = supervise_plans(plans, run_id, tmp_path, grace_period=1)
    assert str(result.error).startswith("worker:1 on 127.0.0.1 exited with code 4\n")
    assert result.task("evaluator:0")["signal"] == "SIGTERM"
    assert result.task("evaluator:0")["failure_ignored"] is False
    assert "training goes on" not in result.console
    assert_run_gone(run_id)
