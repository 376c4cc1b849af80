"""--min-hosts: the pure rule, fed attempts on a clock moved by hand.

A run on h1, h2 and h3 (h3 this machine). A host left out with no spare for it stops the run as
before, unless --min-hosts is given and that many hosts remain without it: then the restart drops
its tasks (`Restart.dropped`) and the run goes on on fewer hosts. Spares are taken first."""

from launcher.supervise import causes, runrecord
from launcher.supervise.causes import Cause, Evidence, classify
from launcher.supervise.hosts import FleetView, left_out_head
from launcher.supervise.policy import GiveUp, Policy, ReadyLineSeen, Restart, Rules, Stop, TaskEnded, TaskRole
from launcher.supervise.resize import Placed, place

WORKERS = [TaskRole("worker:0"), TaskRole("worker:1"), TaskRole("worker:2")]


def failed_attempt(p: Policy, now: float) -> Stop:
    """Every worker ready at `now`; 30 s later worker:1 ends with the code of a lost connection."""
    p.begin_attempt(WORKERS, now)
    p.on([ReadyLineSeen(role.name) for role in WORKERS], now)
    stop = p.on([TaskEnded("worker:1", 255)], now + 30.0)[-1]
    assert isinstance(stop, Stop) and stop.status == runrecord.FAILED
    return stop


def lost(task: str, host: str) -> Cause:
    return classify(Evidence(runrecord.FAILED, task, host, None, lost="SSH keepalives unanswered", login_ok=False))


def fleet(*spares: str, in_use=("h1", "h2", "h3")) -> FleetView:
    return FleetView(in_use, frozenset({"h3"}), spares)


def policy(min_hosts: int = 0, max_restarts: int = 3) -> Policy:
    return Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=max_restarts, min_hosts=min_hosts))


def test_a_host_lost_with_no_spare_is_dropped_while_min_hosts_remain():
    p = policy(min_hosts=2)
    decision = p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [], fleet())
    assert decision == Restart("restarting all tasks without h2 (restart 1 of 3)", leave_out="h2", dropped=("h2",))


def test_without_min_hosts_nothing_changes():
    p = policy()
    decision = p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [], fleet())
    assert decision == GiveUp("no spare host left to take the tasks of h2", left_out=("h2",))


def test_below_min_hosts_the_run_stops_naming_the_hosts_and_why():
    p = policy(min_hosts=2)
    decision = p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [lost("worker:0", "h1")], fleet())
    assert decision == GiveUp(
        "no spare host left to take the tasks of h2, h1; the 1 host left would be fewer than --min-hosts 2",
        left_out=("h2", "h1"), fewer="the 1 host left would be fewer than --min-hosts 2")


def test_hosts_shrink_one_by_one_down_to_min_hosts_and_no_further():
    p = policy(min_hosts=2)
    assert p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [], fleet()).dropped == ("h2",)
    # The next attempt runs on h1 and h3: losing h1 would leave one host.
    decision = p.after(failed_attempt(p, 200.0), lost("worker:0", "h1"), 60, [], fleet(in_use=("h1", "h3")))
    assert isinstance(decision, GiveUp) and decision.left_out == ("h1",), decision
    assert decision.fewer == "the 1 host left would be fewer than --min-hosts 2"


def test_spares_are_taken_first_and_only_the_hosts_without_one_are_dropped():
    p = policy(min_hosts=1)
    decision = p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [lost("worker:0", "h1")], fleet("h4"))
    assert decision == Restart("restarting all tasks without h2, h1 (restart 1 of 3)", leave_out="h2",
                               leave_out_too=("h1",), dropped=("h1",))
    # With a spare for each, none is dropped.
    p = policy(min_hosts=1)
    decision = p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [], fleet("h4"))
    assert decision.dropped == ()


def test_a_preempted_attempt_drops_a_host_lost_beside_it():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=0, max_preemption_restarts=2, min_hosts=2))
    preempted = Cause(causes.PREEMPTED, "worker:0", "h1", "exit code 42")
    assert p.after(failed_attempt(p, 100.0), preempted, 50, [lost("worker:1", "h2")], fleet()) == Restart(
        "restarting all tasks without h2 after preemption (1 of at most 2)", leave_out_too=("h2",), dropped=("h2",))


def test_no_restart_left_stops_whatever_min_hosts_says():
    p = policy(min_hosts=1, max_restarts=0)
    assert p.after(failed_attempt(p, 100.0), lost("worker:1", "h2"), 50, [], fleet()) == GiveUp()


def test_this_machine_is_counted_among_the_hosts_that_remain_and_never_dropped():
    assert place(("h2",), fleet(), 3) == Placed(False, reason="no spare host left to take the tasks of h2; the 2 "
                                                "hosts left would be fewer than --min-hosts 3",
                                                fewer="the 2 hosts left would be fewer than --min-hosts 3")
    assert place(("h1", "h2"), fleet(), 1) == Placed(True, ("h1", "h2"))
    assert place((), fleet(), 3) == Placed(True)
    assert place(("h2",), None, 3) == Placed(True)  # no fleet seen: spares are not counted here


def test_the_line_a_run_stops_with_below_min_hosts_says_why():
    assert left_out_head({"h2": "host-lost: gone"}, ["worker:1"], "mgpu launch --workers h1:2222",
                         "the 1 host left would be fewer than --min-hosts 2") == (
        "h2 left out (host-lost: gone) and no spare host to take worker:1; the 1 host left would be fewer than "
        "--min-hosts 2; relaunch without it:\n  mgpu launch --workers h1:2222")
