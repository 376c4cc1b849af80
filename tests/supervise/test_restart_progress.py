"""Restarts must make progress: real processes under supervise(), small Python programs."""

import datetime
import re
import sys

import pytest

from launcher.errors import TaskFailed
from supervisor_helpers import make_plans, supervise_plans

pytestmark = pytest.mark.timeout(60)


def running(run_id, program: str, **options):
    """One local worker running `program` with this Python; the attempt's number is `attempt`."""
    plans = make_plans(run_id, [], workers=1)
    code = f"import os, sys\nattempt = int(os.environ['MGPU_ATTEMPT'])\n{program}"
    plans[0] = type(plans[0])(**{**plans[0].__dict__, "argv": (sys.executable, "-c", code)})
    return plans


def test_the_same_exception_on_every_start_stops_after_two_attempts(run_id, tmp_path):
    plans = running(run_id, "raise ValueError('bad setting: lr=-1')")
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=5)
    assert isinstance(result.error, TaskFailed)
    assert [a["outcome"] for a in result.run["attempts"]] == ["failed", "failed"]
    assert "stopped restarting: the same error twice in a row without progress: ValueError: bad setting: lr=-1" \
        in str(result.error)
    first = result.run["attempts"][0]
    assert (first["cause"], first["task"], first["host"]) == ("program-error", "worker:0", "127.0.0.1")
    assert first["detail"].startswith("ValueError: bad setting: lr=-1 at ")


def test_a_program_preempted_on_every_start_is_restarted_each_time(run_id, tmp_path):
    plans = running(run_id, "sys.exit(42 if attempt < 3 else 0)")
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=0)
    assert result.error is None
    assert [a.get("cause") for a in result.run["attempts"]] == ["preempted", "preempted", "preempted", None]


def test_a_program_that_makes_progress_before_each_failure_uses_its_restarts(run_id, tmp_path):
    plans = running(run_id, "print(f'MGPU_PROGRESS {10 * (attempt + 1)}/100', flush=True)\nraise ValueError('flaky')")
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=3)
    assert isinstance(result.error, TaskFailed)
    assert len(result.run["attempts"]) == 4
    assert str(result.error).startswith("worker:0 on 127.0.0.1 exited with code 1, after 3 restarts\n")
    assert "stopped restarting" not in str(result.error)


def test_a_kill_mgpu_did_not_send_is_not_called_out_of_memory_without_a_record(run_id, tmp_path):
    plans = running(run_id, "os.kill(os.getpid(), 9)")
    result = supervise_plans(plans, run_id, tmp_path)
    last = str(result.error).splitlines()[-1]
    assert last.startswith("cause: killed: killed by SIGKILL from outside mgpu; no out-of-memory kill in its memory "
                           "cgroup (") or last == ("cause: killed: killed by SIGKILL that mgpu did not send (out of "
                                                   "memory, or a kill from outside: no record of which here)"), last
    assert result.run["attempts"][0]["cause"] == "killed"


def test_what_failures_cost_is_in_run_json_and_the_closing_line(run_id, tmp_path):
    program = ("print(f'MGPU_PROGRESS {10 * (attempt + 1)}/30', flush=True)\n"
               "import time\n"
               "if attempt < 2: time.sleep(0.5); raise ValueError(f'flaky {attempt}')")
    result = supervise_plans(running(run_id, program), run_id, tmp_path, max_restarts=2)
    assert result.error is None
    attempts = result.run["attempts"]
    assert [a["progress"] for a in attempts] == [{"last_step": 10, "gained": 10}, {"last_step": 20, "gained": 10},
                                                 {"last_step": 30, "gained": 10}]
    assert attempts[2]["ready_at"] is not None  # the failed ones ended before they joined: never ready
    # A failed attempt loses the time from its last new step to its end (the program sleeps there),
    # never more than the attempt lasted; the attempt that succeeded loses only its start-up and its
    # finish: each restart jumped past the best step before it, so nothing was redone.
    for attempt in attempts[:2]:
        lasted = (datetime.datetime.fromisoformat(attempt["ended_at"])
                  - datetime.datetime.fromisoformat(attempt["started_at"])).total_seconds()
        assert 0 < attempt["time_lost_s"] <= lasted + 0.002, attempt
        assert attempt["lost_s"]["after_last_step"] >= 0.5, attempt
    last = attempts[2]["lost_s"]
    assert last["redone"] == last["after_last_step"] == last["stalled"] == 0
    assert attempts[2]["time_lost_s"] == pytest.approx(last["start_up"] + last["finish"], abs=0.0021)
    costs = result.run["costs"]
    assert costs["restarts"] == 2 and costs["left_out"] == []
    # The run's time lost is its attempts' and the time between them, before the first and after the
    # last. Each figure is rounded to the millisecond on its own: a sum may be a few ms off the total's.
    between = sum(a["restart_before_s"] for a in attempts)
    assert costs["lost_s"]["restart"] == pytest.approx(between, abs=0.0021)
    assert costs["time_lost_s"] >= sum(a["time_lost_s"] for a in attempts) + between - 0.005
    assert costs["goodput"] == pytest.approx((costs["wall_s"] - costs["time_lost_s"]) / costs["wall_s"], abs=1e-3)
    assert costs["goodput"] < 1
    closing = result.console.splitlines()[-1]
    assert re.fullmatch(r"\[mgpu\] done: 1 tasks succeeded in \S+ s; 2 restarts \(worker:0 failed at \d\d:\d\d: "
                        r"ValueError: flaky 0 at [^,]+, worker:0 failed at \d\d:\d\d: ValueError: flaky 1 at [^)]+\); "
                        r"goodput \d+%; \S+ s lost: [^;]*; logs and run.json in .*/", closing), closing


def test_a_peer_blamed_by_the_failed_task_is_charged_not_the_signal_mgpu_sent_it(run_id, tmp_path):
    # worker:0 reports worker:1 unhealthy and fails; worker:1 runs on until mgpu stops it with SIGTERM,
    # which is mgpu's, not a preemption.
    program = ("import time\n"
               "if os.environ['MGPU_TASK_INDEX'] == '1':\n    time.sleep(60)\n"
               "print('The following tasks are unhealthy (stopped sending heartbeats):', file=sys.stderr)\n"
               "print('/job:worker/replica:0/task:1', file=sys.stderr)\n"
               "sys.exit(1)")
    plans = make_plans(run_id, [], workers=2)
    code = f"import os, sys\n{program}"
    plans = [type(p)(**{**p.__dict__, "argv": (sys.executable, "-c", code)}) for p in plans]
    result = supervise_plans(plans, run_id, tmp_path)
    first = result.run["attempts"][0]
    assert first["tasks"]["worker:1"]["signal"] == "SIGTERM"
    assert (first["cause"], first["task"]) == ("program-error", "worker:1"), first


def test_a_sigterm_from_outside_is_a_preemption(run_id, tmp_path):
    plans = running(run_id, "import signal\nif attempt == 0:\n    os.kill(os.getpid(), signal.SIGTERM)")
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=0)
    assert result.error is None
    assert [a.get("cause") for a in result.run["attempts"]] == ["preempted", None]
    assert "[mgpu] restarting all tasks after preemption (1 of at most 100)" in result.console


def test_this_machine_is_never_left_out(run_id, tmp_path):
    # Killed twice in a row on one host would leave that host out; not the launcher's own machine.
    plans = running(run_id, "if attempt < 2:\n    os.kill(os.getpid(), 9)")
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=3)
    assert result.error is None, result.error
    assert [a.get("cause") for a in result.run["attempts"]] == ["killed", "killed", None]
    assert result.run["costs"]["left_out"] == []
