"""The supervisor's rules, fed events and a clock moved by hand: no process, no sleep."""

import signal

import pytest

from launcher import protocol
from launcher.supervise import runrecord
from launcher.supervise.policy import (
    JOIN_PROBE_INTERVAL, CpuSeen, FailureIgnored, GiveUp, JoinSeen, Notice, OutputSeen, Policy, Ready,
    ReadyLineSeen, Restart, Rules, SignalReceived, Stop, TaskEnded, TaskRole, Watch,
)
from launcher.supervise.stall import CPU_ACTIVITY_SHARE

WORKERS = [TaskRole("worker:0"), TaskRole("worker:1")]
EVALUATOR = TaskRole("evaluator", sidecar=True)


def policy(start_timeout=10.0, stall_timeout=0.0, **rules):
    return Policy(Rules(start_timeout=start_timeout, stall_timeout=stall_timeout, **rules), grace_period=7)


def last(decisions):
    return decisions[-1]


def notices(decisions):
    return [d.text for d in decisions if isinstance(d, Notice)]


def ready(decisions):
    return [d.name for d in decisions if isinstance(d, Ready)]


def started(p, roles=WORKERS, now=100.0):
    decisions = p.begin_attempt(roles, now)
    assert isinstance(last(decisions), Watch)
    return decisions


def all_ready(p, roles=WORKERS, now=100.0):
    started(p, roles, now)
    decisions = p.on([ReadyLineSeen(r.name) for r in roles if not r.ready_when_started], now)
    assert ready(decisions) == [r.name for r in roles if not r.ready_when_started]
    return decisions


# -- the start deadline --------------------------------------------------------------------------

def test_the_start_deadline_names_the_training_tasks_not_ready():
    p = policy(start_timeout=10.0)
    started(p, now=100.0)
    assert ready(p.on([ReadyLineSeen("worker:0")], 105.0)) == ["worker:0"]
    assert isinstance(last(p.on([], 110.0)), Watch)  # the deadline itself still counts as in time
    decisions = p.on([], 110.01)
    assert last(decisions) == Stop(runrecord.START_TIMEOUT, missing=("worker:1",))
    assert notices(decisions) == ["not ready after 10 s: worker:1; stopping all tasks"]


def test_the_watch_looks_again_by_the_start_deadline():
    # At the next probe for joins, or at the deadline when that comes first; not at once (a busy loop).
    p = policy(start_timeout=10.0)
    assert last(started(p, now=100.0)).until == 100.0 + JOIN_PROBE_INTERVAL
    p = policy(start_timeout=0.1)
    assert last(started(p, now=100.0)).until == 100.1


def test_ready_tasks_pass_the_start_deadline_and_are_announced_once():
    p = policy(start_timeout=10.0)
    decisions = all_ready(p, now=100.0)
    assert notices(decisions) == ["all 2 tasks ready after 0.0 s"]
    assert notices(p.on([ReadyLineSeen("worker:0")], 1000.0)) == []
    assert isinstance(last(p.on([], 10_000.0)), Watch)


def test_a_task_with_nothing_to_wait_for_is_ready_when_started():
    p = policy()
    decisions = started(p, [TaskRole("worker:0", ready_when_started=True), TaskRole("worker:1")])
    assert ready(decisions) == ["worker:0"]


def test_an_evaluator_that_never_gets_ready_does_not_time_out_the_start():
    p = policy(start_timeout=10.0)
    started(p, WORKERS + [EVALUATOR], now=0.0)
    p.on([ReadyLineSeen("worker:0"), ReadyLineSeen("worker:1")], 1.0)
    assert isinstance(last(p.on([], 50.0)), Watch)


def test_tasks_ready_by_joining_are_probed_at_an_interval_until_they_join():
    p = policy(start_timeout=10.0)
    roles = [TaskRole("worker:0", ready_by_joining=True), TaskRole("worker:1", ready_by_joining=True)]
    watch = last(started(p, roles, now=0.0))
    assert watch.probe_joins == ("worker:0", "worker:1")
    assert last(p.on([], 0.1)).probe_joins == ()  # not due yet
    decisions = p.on([JoinSeen("worker:1")], JOIN_PROBE_INTERVAL)
    assert ready(decisions) == ["worker:1"] and last(decisions).probe_joins == ("worker:0",)
    decisions = p.on([JoinSeen("worker:0")], 2 * JOIN_PROBE_INTERVAL)
    assert ready(decisions) == ["worker:0"] and notices(decisions) == ["all 2 tasks ready after 0.5 s"]


def test_tasks_that_end_before_any_sign_are_ready_but_not_announced():
    p = policy()
    started(p, now=0.0)
    decisions = p.on([TaskEnded("worker:0", 0), TaskEnded("worker:1", 0)], 1.0)
    assert last(decisions) == Stop(runrecord.SUCCEEDED)
    assert ready(decisions) == ["worker:0", "worker:1"]  # a training task that ended 0 had joined
    assert notices(decisions) == []


def test_a_task_that_ended_early_is_not_announced_with_the_others():
    p = policy()
    started(p, now=0.0)
    decisions = p.on([TaskEnded("worker:0", 0), ReadyLineSeen("worker:1")], 1.0)
    assert ready(decisions) == ["worker:0", "worker:1"]
    assert notices(decisions) == []


# -- fail fast and sidecars ----------------------------------------------------------------------

def test_the_first_training_failure_stops_the_attempt():
    p = policy()
    all_ready(p)
    decisions = p.on([TaskEnded("worker:0", 0), TaskEnded("worker:1", 3)], 101.0)
    assert last(decisions) == Stop(runrecord.FAILED, failed="worker:1", returncode=3)
    assert notices(decisions) == ["worker:1 exited with code 3; stopping all tasks"]


def test_of_two_failures_seen_together_the_first_is_charged():
    p = policy()
    all_ready(p)
    decisions = p.on([TaskEnded("worker:1", -9), TaskEnded("worker:0", 1)], 101.0)
    assert last(decisions).failed == "worker:1"


def test_a_failure_before_the_start_deadline_is_a_failure_not_a_timeout():
    p = policy(start_timeout=1.0)
    started(p, now=0.0)
    assert last(p.on([TaskEnded("worker:1", 2)], 5.0)).status == runrecord.FAILED


def test_a_failed_sidecar_is_a_notice_and_training_goes_on():
    p = policy()
    all_ready(p, WORKERS + [EVALUATOR])
    decisions = p.on([TaskEnded("evaluator", -signal.SIGKILL)], 101.0)
    assert FailureIgnored("evaluator") in decisions
    assert notices(decisions) == ["evaluator was killed by SIGKILL; training goes on without it"]
    assert isinstance(last(decisions), Watch)
    assert last(p.on([TaskEnded("worker:0", 0), TaskEnded("worker:1", 0)], 102.0)) == Stop(runrecord.SUCCEEDED)


def test_the_attempt_waits_for_the_sidecar_once_training_is_done():
    p = policy(stall_timeout=5.0)
    all_ready(p, WORKERS + [EVALUATOR], now=0.0)
    assert isinstance(last(p.on([TaskEnded("worker:0", 0), TaskEnded("worker:1", 0)], 1.0)), Watch)
    assert isinstance(last(p.on([], 1000.0)), Watch)  # a sidecar still at work is not a stall
    assert last(p.on([TaskEnded("evaluator", 0)], 1001.0)) == Stop(runrecord.SUCCEEDED)


def test_without_training_tasks_every_task_counts():
    p = policy()
    all_ready(p, [TaskRole("ps:0")])
    assert last(p.on([TaskEnded("ps:0", 1)], 101.0)).failed == "ps:0"


# -- parameter-server training: the chief's outcome is the run's ----------------------------------

PS_CLUSTER = [TaskRole("chief:0"), TaskRole("worker:0", serves=True), TaskRole("worker:1", serves=True),
              TaskRole("ps:0", serves=True)]


def test_the_servers_are_stopped_once_the_chief_is_done_and_the_attempt_succeeds():
    p = policy(stall_timeout=5.0)
    all_ready(p, PS_CLUSTER, now=0.0)
    assert isinstance(last(p.on([OutputSeen("chief:0", 3.0)], 3.0)), Watch)
    decisions = p.on([TaskEnded("chief:0", 0)], 4.0)
    assert last(decisions) == Stop(runrecord.SUCCEEDED)
    assert notices(decisions) == ["chief:0 ended; stopping the servers (worker:0, worker:1, ps:0), "
                                  "which serve until stopped"]


def test_a_server_that_dies_while_the_chief_runs_fails_the_attempt():
    p = policy()
    all_ready(p, PS_CLUSTER, now=0.0)
    decisions = p.on([TaskEnded("ps:0", -signal.SIGKILL)], 2.0)
    assert last(decisions) == Stop(runrecord.FAILED, failed="ps:0", returncode=-signal.SIGKILL)
    assert last(p.on([TaskEnded("chief:0", 0)], 3.0)).status == runrecord.FAILED  # stopped stays stopped


def test_a_chief_that_fails_fails_the_attempt_with_servers_running():
    p = policy()
    all_ready(p, PS_CLUSTER, now=0.0)
    assert last(p.on([TaskEnded("chief:0", 1)], 2.0)) == Stop(runrecord.FAILED, failed="chief:0", returncode=1)


def test_servers_still_joining_when_the_chief_is_done_are_ready_and_the_sidecar_is_waited_for():
    p = policy(start_timeout=10.0)
    started(p, PS_CLUSTER + [EVALUATOR], now=0.0)
    assert ready(p.on([ReadyLineSeen("chief:0"), JoinSeen("ps:0"), ReadyLineSeen("evaluator")], 1.0)) == [
        "chief:0", "ps:0", "evaluator"]
    assert isinstance(last(p.on([TaskEnded("chief:0", 0)], 2.0)), Watch)  # the evaluator is still at work
    decisions = p.on([TaskEnded("evaluator", 0)], 3.0)
    assert ready(decisions) == ["worker:0", "worker:1"]
    assert last(decisions) == Stop(runrecord.SUCCEEDED)


# -- signals -------------------------------------------------------------------------------------

def test_a_stop_signal_comes_before_everything_else():
    p = policy()
    started(p, now=0.0)
    decisions = p.on([TaskEnded("worker:0", 3), SignalReceived(signal.SIGINT)], 1.0)
    assert last(decisions) == Stop(runrecord.INTERRUPTED, signum=signal.SIGINT)
    assert notices(decisions) == [
        "received SIGINT; stopping all tasks: waiting up to 7 s for them to exit (Ctrl-C again to kill now)"]
    assert isinstance(p.after(last(decisions)), GiveUp)


def test_a_stopped_attempt_stays_stopped():
    p = policy()
    started(p, now=0.0)
    stop = last(p.on([TaskEnded("worker:0", 3)], 1.0))
    assert p.on([TaskEnded("worker:1", 0)], 2.0) == [stop]


# -- stalls --------------------------------------------------------------------------------------

def test_no_progress_for_the_stall_timeout_is_a_stall():
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    assert isinstance(last(p.on([], 59.9)), Watch)
    decisions = p.on([], 60.0)
    assert last(decisions) == Stop(runrecord.STALLED, idle_for=60.0)
    assert "no progress from any training task for 60 s" in notices(decisions)[0]


def test_a_stall_notice_says_only_what_was_seen():
    """"No CPU use" only for tasks whose CPU was measured (not over SSH or in a Slurm step)."""
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    assert "(no output; CPU use not measured)" in notices(p.on([], 60.0))[0]
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    p.on([CpuSeen("worker:0", 1.0)], 10.0)
    p.on([CpuSeen("worker:0", 1.0)], 20.0)
    assert "(no output, no CPU use; CPU use not measured for worker:1)" in notices(p.on([], 60.0))[0]
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    for t in (10.0, 20.0):
        p.on([CpuSeen("worker:0", 1.0), CpuSeen("worker:1", 1.0)], t)
    assert "(no output, no CPU use);" in notices(p.on([], 60.0))[0]


def test_the_watch_looks_again_when_a_stall_would_be_due():
    # At the next CPU sample (every quarter of the stall timeout, at most 10 s), or when the stall
    # would be due (the last activity, 30 s, and the timeout) if that comes first.
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    assert last(p.on([OutputSeen("worker:0", 30.0)], 30.0)).until == 40.0
    assert last(p.on([], 85.0)).until == 90.0


def test_output_from_any_training_task_is_progress():
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    for t in range(10, 600, 10):
        assert isinstance(last(p.on([OutputSeen(f"worker:{t // 10 % 2}", t)], t)), Watch)


def test_output_from_a_sidecar_is_not_progress():
    p = policy(stall_timeout=60.0)
    all_ready(p, WORKERS + [EVALUATOR], now=0.0)
    p.on([OutputSeen("evaluator", 50.0)], 50.0)
    assert last(p.on([OutputSeen("evaluator", 61.0)], 61.0)).status == runrecord.STALLED


def test_cpu_use_is_progress_and_is_sampled_when_due():
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    watch = last(p.on([], 0.0))
    assert watch.sample_cpu == ()  # the first sample was asked for when the clock started
    interval = 15.0  # a quarter of the timeout
    cpu = 0.0
    for t in range(0, 300, int(interval)):
        cpu += CPU_ACTIVITY_SHARE * interval  # just busy enough
        decisions = p.on([CpuSeen("worker:0", cpu), CpuSeen("worker:1", 0.0)], float(t))
        assert isinstance(last(decisions), Watch), t


def test_cpu_below_the_progress_share_is_no_progress():
    p = policy(stall_timeout=60.0)
    all_ready(p, now=0.0)
    cpu = 0.0
    for t in range(0, 60, 15):
        cpu += CPU_ACTIVITY_SHARE * 15 * 0.5
        p.on([CpuSeen("worker:0", cpu)], float(t))
    assert last(p.on([], 60.0)).status == runrecord.STALLED


def test_the_cpu_of_running_training_tasks_is_asked_for_a_quarter_of_the_timeout_apart():
    p = policy(stall_timeout=20.0)
    decisions = all_ready(p, now=0.0)
    assert last(decisions).sample_cpu == ("worker:0", "worker:1")
    assert last(p.on([], 4.9)).sample_cpu == ()
    assert last(p.on([TaskEnded("worker:0", 0)], 5.0)).sample_cpu == ("worker:1",)


def test_the_cpu_is_sampled_at_least_every_ten_seconds_whatever_the_timeout():
    p = policy(stall_timeout=3600.0)
    all_ready(p, now=0.0)
    assert last(p.on([], 10.0)).sample_cpu == ("worker:0", "worker:1")


def test_the_stall_clock_starts_once_every_task_is_ready():
    p = policy(start_timeout=1000.0, stall_timeout=60.0)
    started(p, now=0.0)
    assert isinstance(last(p.on([ReadyLineSeen("worker:0")], 500.0)), Watch)
    p.on([ReadyLineSeen("worker:1")], 900.0)
    assert isinstance(last(p.on([], 959.0)), Watch)
    assert last(p.on([], 960.0)).status == runrecord.STALLED


def test_zero_is_no_stall_watchdog():
    p = policy(stall_timeout=0.0)
    all_ready(p, now=0.0)
    assert isinstance(last(p.on([], 1e9)), Watch)


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

from launcher.supervise import causes  # noqa: E402
from launcher.supervise.causes import Cause, Evidence, classify  # noqa: E402


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


def test_a_job_whose_tasks_all_ended_before_any_was_seen_joining_is_told_apart():
    p = policy()
    started(p, now=0.0)
    assert last(p.on([TaskEnded("worker:0", 0), TaskEnded("worker:1", 0)], 1.0)) == Stop(runrecord.SUCCEEDED)
    assert p.none_seen_joining()
    # One task seen joining before the ends: the job met.
    p = policy()
    started(p, now=0.0)
    p.on([JoinSeen("worker:0")], 0.5)
    p.on([TaskEnded("worker:0", 0), TaskEnded("worker:1", 0)], 1.0)
    assert not p.none_seen_joining()
    # Tasks whose joining cannot be seen say nothing either way; a sidecar does not count.
    p = policy()
    started(p, [TaskRole("worker:0", ready_when_started=True), TaskRole("evaluator:0", sidecar=True)], now=0.0)
    p.on([TaskEnded("worker:0", 0), TaskEnded("evaluator:0", 0)], 1.0)
    assert not p.none_seen_joining()


def test_of_failures_seen_at_once_a_signal_is_named_before_an_exit_code():
    # A peer's "connection reset" exit and the kill that caused it, seen in one look: the kill is named.
    p = policy()
    all_ready(p, now=0.0)
    decisions = p.on([TaskEnded("worker:0", 1), TaskEnded("worker:1", -9)], 10.0)
    assert last(decisions) == Stop(runrecord.FAILED, failed="worker:1", returncode=-9)
    assert notices(decisions) == ["worker:1 was killed by SIGKILL; stopping all tasks"]
    # Seen one after the other, the first stays the one named.
    p = policy()
    all_ready(p, now=0.0)
    assert last(p.on([TaskEnded("worker:0", 1)], 10.0)).failed == "worker:0"
