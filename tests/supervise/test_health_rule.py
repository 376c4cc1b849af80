"""The health check between attempts, as a rule (pure): hosts that fail it are left out with those the
policy leaves out, each taking a spare; without one, or on this machine, the run stops."""

from launcher.supervise.health import after_checks
from launcher.supervise.hosts import FleetView
from launcher.supervise.policy import GiveUp, Restart

FLEET = FleetView(("here", "h1", "h2"), frozenset({"here"}), ("s1", "s2"))


def test_nothing_found_keeps_the_restart():
    restart = Restart("restarting all tasks (restart 1 of 3)")
    assert after_checks(restart, {}, FLEET) == (restart, [])


def test_an_unhealthy_host_is_left_out_with_the_one_the_policy_leaves_out():
    restart = Restart("restarting all tasks without h1 (restart 1 of 3)", leave_out="h1")
    changed, judged = after_checks(restart, {"h2": "GPU 0: 2 uncorrectable ECC error(s)", "h1": "gone"}, FLEET)
    assert changed == Restart("restarting all tasks without h1, h2 (restart 1 of 3)", leave_out="h1",
                              leave_out_too=("h2",))
    assert [(c.kind, c.host, c.detail) for c in judged] == [("health-check", "h2", "GPU 0: 2 uncorrectable ECC error(s)")]
    alone, _ = after_checks(Restart("restarting all tasks (restart 2 of 3)"), {"h2": "exit 3"}, FLEET)
    assert alone == Restart("restarting all tasks without h2 (restart 2 of 3)", leave_out_too=("h2",))


def test_without_a_spare_or_on_this_machine_the_run_stops():
    fleet = FleetView(("here", "h1", "h2"), frozenset({"here"}), ("s1",))
    stop, _ = after_checks(Restart("restarting all tasks without h1 (restart 1 of 3)", leave_out="h1"),
                           {"h2": "exit 3"}, fleet)
    assert stop == GiveUp("no spare host left to take the tasks of h1, h2", left_out=("h1", "h2"))
    stop, judged = after_checks(Restart("restarting all tasks (restart 1 of 3)"), {"here": "exit 3"}, FLEET)
    assert stop == GiveUp("here failed its health check (exit 3); it is this machine, which is never left out")
    assert judged[0].host == "here"


def test_with_min_hosts_a_host_that_fails_with_no_spare_left_is_dropped_while_enough_remain():
    fleet = FleetView(("here", "h1", "h2", "h3"), frozenset({"here"}), ())
    restart = Restart("restarting all tasks (restart 1 of 3)")
    changed, judged = after_checks(restart, {"h2": "exit 3"}, fleet, min_hosts=3)
    assert changed == Restart("restarting all tasks without h2 (restart 1 of 3)", leave_out_too=("h2",), dropped=("h2",))
    assert [(c.kind, c.host) for c in judged] == [("health-check", "h2")]
    # One spare: the host charged first takes it; the one the check found is dropped.
    spare = FleetView(("here", "h1", "h2", "h3"), frozenset({"here"}), ("s1",))
    changed, _ = after_checks(Restart("restarting all tasks without h1 (restart 1 of 3)", leave_out="h1"),
                              {"h2": "exit 3"}, spare, min_hosts=3)
    assert (changed.left_out, changed.dropped) == (("h1", "h2"), ("h2",))
    # Fewer than --min-hosts would be left: the run stops, saying why.
    stop, _ = after_checks(Restart("restarting all tasks without h1 (restart 1 of 3)", leave_out="h1"),
                           {"h2": "exit 3"}, fleet, min_hosts=3)
    assert stop == GiveUp("no spare host left to take the tasks of h1, h2; the 2 hosts left would be fewer than "
                          "--min-hosts 3", left_out=("h1", "h2"), fewer="the 2 hosts left would be fewer than --min-hosts 3")
