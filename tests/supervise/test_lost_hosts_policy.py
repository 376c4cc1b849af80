"""Hosts lost together, and spares: the pure rules, fed attempts on a clock moved by hand.

A run on h1, h2 and h3 with spares h4 and h5; h1 and h2 die together. Every host judged lost is
left out in one step, each taking a spare of its own; a spare is never charged for a peer that is
gone."""

import pytest

from launcher.supervise import causes, runrecord
from launcher.supervise.causes import Cause, Evidence, check_fault, classify
from launcher.supervise.hosts import FleetView
from launcher.supervise.policy import (
    GiveUp, Policy, ReadyLineSeen, Restart, Rules, Stop, TaskEnded, TaskRole, place_on_spares,
)

WORKERS = [TaskRole("worker:0"), TaskRole("worker:1"), TaskRole("worker:2")]


def failed_attempt(p: Policy, now: float) -> Stop:
    """Every worker ready at `now`; 30 s later worker:0 ends with the code of a lost connection."""
    p.begin_attempt(WORKERS, now)
    p.on([ReadyLineSeen(role.name) for role in WORKERS], now)
    stop = p.on([TaskEnded("worker:0", 255)], now + 30.0)[-1]
    assert isinstance(stop, Stop) and stop.status == runrecord.FAILED
    return stop


def judged(task: str, host: str, lost: str | None, login_ok: bool) -> Cause:
    """A host's cause from what was seen of it: its connection lost (or its tasks without an exit
    status) and a fresh login."""
    return classify(Evidence(runrecord.FAILED, task, host, None, lost=lost, login_ok=login_ok))


H1 = ("worker:0", "h1", "SSH keepalives unanswered", False)
H2 = ("worker:1", "h2", "worker:1 gave no exit status", False)


def test_every_host_lost_in_an_attempt_is_left_out_in_one_step():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    stop = failed_attempt(p, 100.0)
    decision = p.after(stop, judged(*H1), 50, [judged(*H2)])
    assert decision == Restart("restarting all tasks without h1, h2 (restart 1 of 2)", leave_out="h1",
                               leave_out_too=("h2",))
    assert decision.left_out == ("h1", "h2")


def test_a_host_judged_but_not_lost_stays():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    # h3's task was killed once: that leaves a host out only the second time in a row.
    killed = classify(Evidence(runrecord.FAILED, "worker:2", "h3", -9))
    assert killed.kind == causes.KILLED
    decision = p.after(failed_attempt(p, 100.0), judged(*H1), 50, [killed])
    assert decision == Restart("restarting all tasks without h1 (restart 1 of 2)", leave_out="h1")


def test_a_host_lost_beside_a_program_error_is_left_out_too():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=1))
    error = Cause(causes.PROGRAM_ERROR, "worker:0", "h1", "ValueError: x", error="ValueError: x")
    decision = p.after(failed_attempt(p, 100.0), error, None, [judged(*H2)])
    assert decision == Restart("restarting all tasks without h2 (restart 1 of 1)", leave_out=None,
                               leave_out_too=("h2",))
    # No restart left: nothing is left out, the run stops.
    assert p.after(failed_attempt(p, 200.0), judged(*H1), None, [judged(*H2)]) == GiveUp()


def test_each_host_left_out_takes_a_spare_of_its_own():
    assert place_on_spares(["h1", "h2"], ["h4", "h5"]) == (("h1", "h4"), ("h2", "h5"))
    assert place_on_spares(["h1"], ["h4", "h5"]) == (("h1", "h4"),)
    # Two hosts lost and one spare: no place for every task, the run stops.
    assert place_on_spares(["h1", "h2"], ["h4"]) is None
    assert place_on_spares([], []) == ()


# The policy sees the fleet as data: h1, h2 and h3 in use, h3 this machine (where the launcher runs).
def fleet(*spares: str) -> FleetView:
    return FleetView(("h1", "h2", "h3"), frozenset({"h3"}), spares)


def test_this_machine_is_never_left_out():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    here = judged("worker:2", "h3", "worker:2 gave no exit status", False)
    decision = p.after(failed_attempt(p, 100.0), here, 50, [judged(*H2)], fleet("h4", "h5"))
    assert decision == Restart("restarting all tasks without h2 (restart 1 of 2)", leave_out=None,
                               leave_out_too=("h2",))
    # Charged alone, it restarts with every host.
    decision = p.after(failed_attempt(p, 200.0), here, 60, [], fleet("h4", "h5"))
    assert decision == Restart("restarting all tasks (restart 2 of 2)")


def test_a_host_that_runs_no_task_is_not_left_out():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    elsewhere = judged("worker:0", "h9", "SSH keepalives unanswered", False)
    assert p.after(failed_attempt(p, 100.0), elsewhere, 50, [], fleet("h4")) == Restart(
        "restarting all tasks (restart 1 of 2)")


def test_with_a_spare_for_each_host_lost_the_cluster_restarts_on_them():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    decision = p.after(failed_attempt(p, 100.0), judged(*H1), 50, [judged(*H2)], fleet("h4", "h5"))
    assert decision == Restart("restarting all tasks without h1, h2 (restart 1 of 2)", leave_out="h1",
                               leave_out_too=("h2",))


@pytest.mark.parametrize("spares", [(), ("h4",)])
def test_without_a_spare_for_each_host_lost_the_run_stops_naming_them(spares):
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    decision = p.after(failed_attempt(p, 100.0), judged(*H1), 50, [judged(*H2)], fleet(*spares))
    assert decision == GiveUp("no spare host left to take the tasks of h1, h2", left_out=("h1", "h2"))


def test_a_preempted_attempt_with_a_host_lost_and_no_spare_stops_naming_it():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2, max_preemption_restarts=2))
    preempted = Cause(causes.PREEMPTED, "worker:0", "h1", "exit code 42")
    assert p.after(failed_attempt(p, 100.0), preempted, 50, [judged(*H2)], fleet("h4")) == Restart(
        "restarting all tasks without h2 after preemption (1 of at most 2)", leave_out_too=("h2",))
    assert p.after(failed_attempt(p, 200.0), preempted, 60, [judged(*H2)], fleet()) == GiveUp(
        "no spare host left to take the tasks of h2", left_out=("h2",))


def test_no_restart_left_stops_without_leaving_out():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=0))
    assert p.after(failed_attempt(p, 100.0), judged(*H1), 50, [judged(*H2)], fleet()) == GiveUp()


HOSTS = ["h4", "h2", "h3"]  # h1 left out, its spare h4 checked beside the others


def test_a_spare_is_never_charged_for_a_peer_that_is_gone():
    # h2 died too: the check could not log in to it.
    assert check_fault(HOSTS, {"h4"}, {"h2"}, ()) == ((), ("h2",))
    # h2 answers logins, but no host of the test connects to its tasks.
    assert check_fault(HOSTS, {"h4"}, (), {("h4", "h2"), ("h3", "h2")}) == ((), ("h2",))


def test_a_spare_that_no_host_reaches_is_charged():
    assert check_fault(HOSTS, {"h4"}, {"h4"}, ()) == (("h4",), ())
    assert check_fault(HOSTS, {"h4"}, (), {("h2", "h4"), ("h3", "h4")}) == (("h4",), ())


def test_a_spare_that_cannot_connect_to_a_peer_the_others_reach_is_charged():
    assert check_fault(HOSTS, {"h4"}, (), {("h4", "h2")}) == (("h4",), ())


@pytest.mark.parametrize("problems", [((), ()), ((), {("h2", "h3")})])
def test_a_check_that_charges_neither_says_so(problems):
    # h2 cannot reach h3 although h4 can: nothing says who is at fault; the caller charges the spare.
    unreached, cut = problems
    assert check_fault(HOSTS, {"h4"}, unreached, cut) == ((), ())
