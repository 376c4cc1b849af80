"""The supervisor's rules between attempts: restarts, the cause of each failure and hosts left out, on a hand-moved clock."""

import signal

import pytest

from launcher import protocol
from launcher.supervise import causes, runrecord
from launcher.supervise.causes import Cause, Evidence, classify
from launcher.supervise.policy import GiveUp, ReadyLineSeen, Restart, Stop, TaskEnded, Watch
from policy_helpers import all_ready, last, policy, started


# -- restarts ------------------------------------------------------------------------------------

def failure(code=3):
    return Stop(runrecord.FAILED, failed="worker:1", returncode=code)


def test_restarts_are_bounded_by_max_restarts():
    p = policy(max_restarts=2)
    assert p.after(failure()) == Restart("restarting all tasks (restart 1 of 2)")
    assert p.after(Stop(runrecord.STALLED, idle_for=60)) == Restart("restarting all tasks (restart 2 of 2)")
    assert isinstance(p.after(Stop(runrecord.START_TIMEOUT, missing=("worker:1",))), GiveUp)


def test_preemption_restarts_without_using_max_restarts_but_is_bounded():
    p = policy(max_restarts=1, max_preemption_restarts=2)
    preempted = failure(protocol.EXIT_PREEMPTED)
    assert p.after(preempted) == Restart("restarting all tasks after preemption (1 of at most 2)")
    assert p.after(preempted) == Restart("restarting all tasks after preemption (2 of at most 2)")
    assert p.after(preempted) == Restart("restarting all tasks (restart 1 of 1)")
    assert isinstance(p.after(failure()), GiveUp)


@pytest.mark.parametrize("status", [runrecord.SUCCEEDED, runrecord.INTERRUPTED])
def test_success_and_interruption_never_restart(status):
    assert isinstance(policy(max_restarts=5).after(Stop(status)), GiveUp)


def test_each_attempt_starts_afresh():
    p = policy(start_timeout=10.0, max_restarts=1)
    started(p, now=0.0)
    stop = last(p.on([TaskEnded("worker:1", 3)], 1.0))
    assert isinstance(p.after(stop), Restart)
    started(p, now=50.0)
    assert isinstance(last(p.on([ReadyLineSeen("worker:0")], 59.0)), Watch)
    assert last(p.on([], 60.5)) == Stop(runrecord.START_TIMEOUT, missing=("worker:1",))


# -- causes and the rules between attempts ---------------------------------------------------------

@pytest.mark.parametrize("evidence, kind", [
    (Evidence(runrecord.FAILED, "worker:1", "h2", 1, error="ValueError: bad at train.py:3"), causes.PROGRAM_ERROR),
    (Evidence(runrecord.FAILED, "worker:1", "h2", 3), causes.PROGRAM_ERROR),
    (Evidence(runrecord.FAILED, "worker:1", "h2", 255, lost="SSH keepalives unanswered", login_ok=False),
     causes.HOST_LOST),
    (Evidence(runrecord.FAILED, "worker:1", "h2", 255, lost="SSH keepalives unanswered", login_ok=True), causes.NETWORK),
    (Evidence(runrecord.FAILED, "worker:1", "h2", 1, unreachable=("h1", "h2")), causes.NETWORK),
    (Evidence(runrecord.FAILED, "worker:1", "h2", -signal.SIGKILL), causes.KILLED),
    (Evidence(runrecord.FAILED, "worker:1", "h2", protocol.EXIT_PREEMPTED), causes.PREEMPTED),
    (Evidence(runrecord.FAILED, "worker:1", "h2", -signal.SIGTERM), causes.PREEMPTED),
    (Evidence(runrecord.START_TIMEOUT, "worker:1", "h2"), causes.START_TIMEOUT),
    (Evidence(runrecord.STALLED), causes.STALLED),
])
def test_each_failed_attempt_gets_a_cause_charged_to_its_task_and_host(evidence, kind):
    cause = classify(evidence)
    assert (cause.kind, cause.task, cause.host) == (kind, evidence.task, evidence.host)


def test_a_kill_mgpu_did_not_send_is_said_as_far_as_the_evidence_goes():
    def killed(out_of_memory):
        return classify(Evidence(runrecord.FAILED, "worker:0", "h1", -signal.SIGKILL, out_of_memory=out_of_memory)).detail

    assert killed(("/jobs/7", True)) == "killed by the kernel's OOM killer (memory cgroup /jobs/7)"
    assert killed(("/jobs/7", False)) == ("killed by SIGKILL from outside mgpu; no out-of-memory kill in its memory "
                                          "cgroup (/jobs/7)")
    assert killed(None) == ("killed by SIGKILL that mgpu did not send (out of memory, or a kill from outside: "
                            "no record of which here)")


@pytest.mark.parametrize("status", [runrecord.SUCCEEDED, runrecord.INTERRUPTED])
def test_no_cause_without_a_failure(status):
    assert classify(Evidence(status)) is None


def failed_attempt(p, now, code=1):
    """One attempt, driven by the clock: both workers ready, worker:1 ends with `code` 30 s later."""
    all_ready(p, now=now)
    return last(p.on([TaskEnded("worker:1", code)], now + 30.0))


def raised(error="ValueError: bad at train.py:3 in main", host="h2"):
    return Cause(causes.PROGRAM_ERROR, "worker:1", host, error, error=error)


def test_the_same_error_twice_without_progress_stops_whatever_max_restarts_says():
    p = policy(max_restarts=5)
    assert p.after(failed_attempt(p, 0.0), raised(), None) == Restart("restarting all tasks (restart 1 of 5)")
    decision = p.after(failed_attempt(p, 100.0), raised(), None)
    assert decision == GiveUp("the same error twice in a row without progress: ValueError: bad at train.py:3 in main")


def test_the_same_error_after_progress_is_restarted():
    p = policy(max_restarts=3)
    for attempt, step in enumerate([10, 20, 30]):
        assert isinstance(p.after(failed_attempt(p, 100.0 * attempt), raised(), step), Restart)
    assert p.after(failed_attempt(p, 400.0), raised(), 30) == GiveUp(
        "the same error twice in a row without progress: ValueError: bad at train.py:3 in main")


def test_a_different_error_is_not_a_repeat():
    p = policy(max_restarts=5)
    assert isinstance(p.after(failed_attempt(p, 0.0), raised("KeyError: 'x'"), None), Restart)
    assert isinstance(p.after(failed_attempt(p, 100.0), raised(), None), Restart)


def test_preemptions_are_restarted_each_time_without_progress():
    p = policy(max_restarts=0, max_preemption_restarts=5)
    preempted = Cause(causes.PREEMPTED, "worker:1", "h2", "exited with code 42 (preempted)")
    for attempt in range(5):
        stop = failed_attempt(p, 100.0 * attempt, protocol.EXIT_PREEMPTED)
        assert p.after(stop, preempted, None) == Restart(
            f"restarting all tasks after preemption ({attempt + 1} of at most 5)")


def test_a_lost_host_is_left_out_at_once():
    p = policy(max_restarts=2)
    lost = Cause(causes.HOST_LOST, "worker:1", "h2", "SSH keepalives unanswered; a fresh login fails")
    assert p.after(failed_attempt(p, 0.0, 255), lost, 50) == Restart(
        "restarting all tasks without h2 (restart 1 of 2)", leave_out="h2")
    network = Cause(causes.NETWORK, "worker:0", "h1", "h1 cannot reach h3")
    assert p.after(failed_attempt(p, 100.0), network, 60).leave_out == "h1"


@pytest.mark.parametrize("kind, detail", [
    (causes.KILLED, "killed by SIGKILL"),
    (causes.STALLED, "no progress for 60 s"),
    (causes.START_TIMEOUT, "worker:1 not ready after 10 s"),
])
def test_a_host_with_the_same_failure_twice_in_a_row_is_left_out(kind, detail):
    p = policy(max_restarts=5)
    same = Cause(kind, "worker:1", "h2", detail)
    assert p.after(failed_attempt(p, 0.0, -9), same, 10).leave_out is None
    assert p.after(failed_attempt(p, 100.0, -9), same, 20).leave_out == "h2"


def test_the_programs_own_error_twice_leaves_no_host_out():
    # The same error of the program on one host is the program's: no host is left out for it.
    p = policy(max_restarts=5)
    assert p.after(failed_attempt(p, 0.0), raised(), 10).leave_out is None
    assert p.after(failed_attempt(p, 100.0), raised(), 20).leave_out is None
