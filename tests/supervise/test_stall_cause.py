"""What a stall is charged to: the pure rules, on a clock moved by hand.

The hosts are judged before the stall's cause is chosen: a host whose connection is gone is
host-lost or network even when the stall clock ran out before its keepalives did; else a task seen
stopped (SIGSTOP) is the one the others waited for; else no task is named."""

import dataclasses

from launcher.supervise import causes, runrecord
from launcher.supervise.causes import Evidence, TaskState, classify, stall_evidence
from launcher.supervise.hosts import FleetView
from launcher.supervise.policy import CpuSeen, Policy, ReadyLineSeen, Restart, Rules, Stop, TaskRole

WORKERS = [TaskRole("worker:0"), TaskRole("worker:1"), TaskRole("worker:2")]
TASKS = [TaskState("worker:0", "h1", local=False), TaskState("worker:1", "h2", local=False),
         TaskState("worker:2", "h3", local=False)]
LOGINS_OK = {"h1": True, "h2": True, "h3": True}


def stalled_attempt(p: Policy, now: float) -> Stop:
    """Every worker ready at `now`, then no output and no CPU use until the stall clock runs out."""
    p.begin_attempt(WORKERS, now)
    p.on([ReadyLineSeen(role.name) for role in WORKERS], now)
    stop = None
    for second in range(1, 60):
        decisions = p.on([CpuSeen(role.name, 1.0) for role in WORKERS], now + second)
        if isinstance(decisions[-1], Stop):
            stop = decisions[-1]
            break
    assert stop is not None and stop.status == runrecord.STALLED
    return stop


def with_(name: str, **changes) -> list[TaskState]:
    return [TaskState(t.name, t.host, t.local, **changes) if t.name == name else t for t in TASKS]


def test_a_stall_with_a_lost_connection_is_the_hosts_fault():
    cause = classify(Evidence(runrecord.STALLED, "worker:0", "h1", lost="SSH keepalives unanswered", login_ok=False))
    assert (cause.kind, cause.task, cause.host) == (causes.HOST_LOST, "worker:0", "h1")
    cause = classify(Evidence(runrecord.STALLED, "worker:0", "h1", lost="SSH keepalives unanswered", login_ok=True))
    assert (cause.kind, cause.task, cause.host) == (causes.NETWORK, "worker:0", "h1")


def test_a_host_that_fails_a_fresh_login_after_a_stall_is_lost_before_its_keepalives_say_so():
    # The coordinator's link is cut: no connection is judged lost yet, but its host answers no login.
    cause = classify(stall_evidence(TASKS, {**LOGINS_OK, "h1": False}))
    assert (cause.kind, cause.task, cause.host) == (causes.HOST_LOST, "worker:0", "h1")
    assert "a fresh login fails" in cause.detail


def test_a_cause_says_how_the_host_was_asked_after_its_loss():
    # In a Slurm allocation no node is logged in to: the controller's state for it is the answer.
    lost = Evidence(runrecord.FAILED, "worker:1", "h2", lost="Slurm says node h2 is down", login_ok=False,
                    asked=causes.NODE_STATE)
    assert classify(lost).detail == "Slurm says node h2 is down; Slurm's controller has the node down"
    up = dataclasses.replace(lost, lost="srun lost the step's connection to h2", login_ok=True)
    assert classify(up).detail == "srun lost the step's connection to h2, but Slurm's controller has the node up"
    stalled = classify(stall_evidence(TASKS, {**LOGINS_OK, "h1": False}, asked=causes.NODE_STATE))
    assert stalled.detail == "its tasks went silent; Slurm's controller has the node down"


def test_a_lost_connection_is_charged_before_a_stopped_task():
    tasks = [TaskState("worker:0", "h1", False, stopped=True), TaskState("worker:1", "h2", False, lost="SSH keepalives unanswered"),
             TaskState("worker:2", "h3", False)]
    cause = classify(stall_evidence(tasks, {"h2": True}))
    assert (cause.kind, cause.task, cause.host) == (causes.NETWORK, "worker:1", "h2")


def test_a_stopped_task_is_named_as_the_one_the_others_waited_for():
    cause = classify(stall_evidence(with_("worker:1", stopped=True), LOGINS_OK, progress=7))
    assert (cause.kind, cause.task, cause.host) == (causes.STALLED, "worker:1", "h2")
    assert "worker:1 was stopped" in cause.detail and "waited for it" in cause.detail


def test_a_stopped_task_on_this_machine_is_named_without_any_login():
    tasks = [TaskState("worker:0", "this", True), TaskState("worker:1", "this", True, stopped=True)]
    cause = classify(stall_evidence(tasks, {}))
    assert (cause.task, cause.host) == ("worker:1", "this")


def test_a_stall_with_every_host_answering_and_no_task_stopped_names_none():
    cause = classify(stall_evidence(TASKS, LOGINS_OK))
    assert (cause.kind, cause.task, cause.host) == (causes.STALLED, None, None)
    assert cause.detail == "no progress from any training task"


def test_a_host_whose_login_was_not_tried_is_not_charged():
    cause = classify(stall_evidence(TASKS, {"h1": None}))
    assert cause.task is None


def test_a_stall_charged_to_a_lost_host_leaves_it_out_at_once():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=20.0, max_restarts=2))
    stop = stalled_attempt(p, 100.0)
    cause = classify(stall_evidence(TASKS, {**LOGINS_OK, "h1": False}))
    after = p.after(stop, cause, None, (), FleetView(("h1", "h2", "h3"), frozenset(), ("h4",)))
    assert isinstance(after, Restart) and after.leave_out == "h1"


def test_a_stall_charged_to_a_stopped_task_restarts_on_the_same_hosts():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=20.0, max_restarts=2))
    stop = stalled_attempt(p, 100.0)
    cause = classify(stall_evidence(with_("worker:1", stopped=True), LOGINS_OK))
    after = p.after(stop, cause, None, (), FleetView(("h1", "h2", "h3"), frozenset(), ("h4",)))
    assert isinstance(after, Restart) and after.left_out == ()
