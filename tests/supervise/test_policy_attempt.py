"""The supervisor's rules within one attempt: start, failures, sidecars, servers, signals and stalls, on a hand-moved clock."""

import signal

from launcher.supervise import runrecord
from launcher.supervise.policy import (
    JOIN_PROBE_INTERVAL, CpuSeen, FailureIgnored, GiveUp, JoinSeen, Notice, OutputSeen, ReadyLineSeen,
    SignalReceived, Stop, TaskEnded, TaskRole, Watch,
)
from launcher.supervise.stall import CPU_ACTIVITY_SHARE
from policy_helpers import WORKERS, all_ready, last, policy, ready, started

EVALUATOR = TaskRole("evaluator", sidecar=True)


def notices(decisions):
    return [d.text for d in decisions if isinstance(d, Notice)]


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
