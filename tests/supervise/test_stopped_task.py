"""A task stopped mid-run (SIGSTOP), with real processes: it is named as the one the others wait
for, and the stall it causes is charged to it; its stack is where it was stopped."""

import json
import os
import signal

from launcher.errors import TaskFailed
from supervisor_helpers import LeapingClock, assert_run_gone, make_plans, recorded_ready, supervise_plans

FAULTHANDLER = {"PYTHONFAULTHANDLER": "1"}  # the planner sets it for every task
STALL_TIMEOUT = 12.0  # the stopped state is looked at every quarter of it


class StopWorker1:
    """A clock's `when`: once both tasks are ready, SIGSTOP to worker:1; holds once the console
    says it is stopped, so that the stall clock leaps past its timeout only after that."""

    def __init__(self, run_dir, console):
        self.ready = recorded_ready(run_dir, "worker:0", "worker:1")
        self.run_json, self.console = run_dir / "run.json", console
        self.stopped_pid = None

    def __call__(self) -> bool:
        if self.stopped_pid is None and self.ready():
            self.stopped_pid = json.loads(self.run_json.read_text())["attempts"][-1]["tasks"]["worker:1"]["pid"]
            os.kill(self.stopped_pid, signal.SIGSTOP)
        return self.console.exists() and "worker:1 on 127.0.0.1 is stopped" in self.console.read_text()


def test_a_stopped_task_is_named_and_charged_with_the_stall(run_id, tmp_path):
    plans = make_plans(run_id, ["--ready", "--forever"], waits_for_ready=True, env=FAULTHANDLER)
    when = StopWorker1(tmp_path / "runs" / run_id, tmp_path / f"console-{run_id}.txt")
    clock = LeapingClock(when, by=STALL_TIMEOUT)
    result = supervise_plans(plans, run_id, tmp_path, stall_timeout=STALL_TIMEOUT, grace_period=1.0, clock=clock)
    assert isinstance(result.error, TaskFailed)
    assert when.stopped_pid is not None
    assert ("[mgpu] worker:1 on 127.0.0.1 is stopped (SIGSTOP, or a debugger): the other tasks wait for it "
            "until it is continued") in result.console
    assert ("attempt 1 failed: stalled (worker:1 on 127.0.0.1): worker:1 was stopped (SIGSTOP, or a debugger): "
            "the other tasks waited for it") in result.console
    attempt = result.run["attempts"][0]
    assert (attempt["cause"], attempt["task"], attempt["host"]) == ("stalled", "worker:1", "127.0.0.1")
    # Continued after the request for stacks: it wrote the stack where it was stopped, and ended by it.
    assert "Fatal Python error: Aborted" in result.log("worker:1")
    assert attempt["tasks"]["worker:1"]["signal"] == "SIGABRT"
    assert_run_gone(run_id)
