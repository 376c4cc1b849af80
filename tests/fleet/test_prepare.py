"""The one way hosts are made ready (launcher/fleet/stages.py), as a spare that takes a host's tasks
goes through it: the same stages as the first start, up to the first that refuses it.

A real fleet with a real SSH backend, the planner's own plans and no host behind the names: the
stages here refuse or warn before any connection, and the checks that would connect are off."""

from __future__ import annotations

import sys

from launcher.backends.ssh.remote_command import MAX_COMMAND_BYTES
from launcher.config.spec import ClusterSpec, TaskSpec
from launcher.fleet.fleet import MachineFleet
from launcher.launch_options import LaunchOptions
from launcher.plan.planner import plan_tasks
from launcher.supervise import sizes
from launcher.supervise.options import SuperviseOptions


def fleet_of(tmp_path, command: tuple[str, ...], spare: str) -> MachineFleet:
    """A run of `command` on h1 and h2 with `spare`, its SSH backend made (as the first start makes it)."""
    spec = ClusterSpec(tasks=(TaskSpec("worker", "h1", 2222), TaskSpec("worker", "h2", 2222)), command=command,
                       spares=(spare,))

    def replan(changed: ClusterSpec):
        return plan_tasks(changed, run_id="r1", local_hosts=frozenset(), launcher_python=sys.executable)

    options = LaunchOptions(SuperviseOptions(run_id="r1", log_dir=tmp_path), check_hosts=False, spec=spec,
                            replan=replan)
    fleet = MachineFleet(replan(spec), options)
    fleet.open_ssh()
    return fleet


def test_a_spare_whose_commands_no_remote_shell_takes_is_refused_before_any_connection(tmp_path):
    fleet = fleet_of(tmp_path, ("python3", "-c", "pass", "x" * MAX_COMMAND_BYTES), spare="h3")
    notices: list[str] = []
    try:
        placement = fleet.replace(["h2"], notices.append)
    finally:
        fleet.close()
    assert placement.plans is None and placement.took == ()
    assert len(notices) == 1 and notices[0].startswith(
        "spare host h3 failed its checks: worker:0: the command line is "), notices
    assert notices[0].endswith(f" bytes; a remote host takes at most {MAX_COMMAND_BYTES} (pass long arguments in a file)")
    assert fleet.spares == () and fleet.made_ready == set()


def test_a_spare_at_a_public_address_gets_the_exposure_warning_for_its_tasks(tmp_path, capsys):
    fleet = fleet_of(tmp_path, ("python3", "-c", "pass"), spare="8.8.4.4")
    notices: list[str] = []
    try:
        placement = fleet.replace(["h2"], notices.append)
    finally:
        fleet.close()
    assert placement.took == (("h2", "8.8.4.4"),) and notices == []
    assert [(plan.name, plan.host) for plan in placement.plans] == [("worker:0", "h1"), ("worker:1", "8.8.4.4")]
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("mgpu: warning: ")] == [
        "mgpu: warning: worker:1 serves TensorFlow on 8.8.4.4 port 2222, a public address; its gRPC server has no "
        "authentication and listens on every interface, so anyone who reaches that port can run code there. "
        "Use private addresses or a firewall (--allow-public silences this)"]
    assert fleet.in_use == ("h1", "8.8.4.4") and fleet.left_out == ["h2"]


def test_a_slow_host_without_a_spare_is_left_out_while_min_hosts_remain(tmp_path):
    """--leave-out-slow with --min-hosts: the plans are made again for the hosts left; below it, or
    without it, the slow host keeps its tasks."""
    spec = ClusterSpec(tasks=tuple(TaskSpec("worker", h, 2222) for h in ("h1", "h2", "h3")), command=("python3", "t.py"))

    def replan(changed: ClusterSpec):
        return plan_tasks(changed, run_id="r1", local_hosts=frozenset(), launcher_python=sys.executable)

    for min_hosts, left in ((2, ["h1", "h3"]), (3, ["h1", "h2", "h3"]), (0, ["h1", "h2", "h3"])):
        options = LaunchOptions(SuperviseOptions(run_id="r1", log_dir=tmp_path, min_hosts=min_hosts), check_hosts=False,
                                spec=spec, replan=replan)
        fleet = MachineFleet(replan(spec), options)
        notices: list[str] = []
        fleet.leave_out_slow(["h2"], notices.append)
        assert [plan.host for plan in fleet.plans] == left, (min_hosts, notices)
        if min_hosts == 2:
            assert notices == ["left out slow host h2: no spare host left to take its tasks; the run goes on on 2 of "
                               "3 hosts (--min-hosts 2)"]
            assert [(p.name, p.env["WORLD_SIZE"], p.env["MGPU_WORLD_SIZE_MAX"]) for p in fleet.plans] == [
                ("worker:0", "2", "3"), ("worker:1", "2", "3")]
        else:
            assert notices == ["warning: --leave-out-slow: no spare host (--spare-hosts) left to take the tasks of h2; "
                               "it runs them"]


def test_a_spare_that_fails_its_checks_has_its_host_dropped_too_while_min_hosts_remain(tmp_path):
    """h2 and h3 lost with one spare: h3 is dropped (--min-hosts), h2 goes to the spare h5, which fails
    its checks (a command no remote shell takes): h2 is dropped too while enough hosts remain."""
    spec = ClusterSpec(tasks=tuple(TaskSpec("worker", h, 2222) for h in ("h1", "h2", "h3", "h4")),
                       command=("python3", "-c", "pass", "x" * MAX_COMMAND_BYTES), spares=("h5",))

    def replan(changed: ClusterSpec):
        return plan_tasks(changed, run_id="r1", local_hosts=frozenset(), launcher_python=sys.executable)

    for min_hosts, left in ((2, ["h1", "h4"]), (3, None)):
        options = LaunchOptions(SuperviseOptions(run_id="r1", log_dir=tmp_path, min_hosts=min_hosts), check_hosts=False,
                                spec=spec, replan=replan)
        fleet = MachineFleet(replan(spec), options)
        fleet.open_ssh()
        notices: list[str] = []
        try:
            placement = sizes.place(fleet, ["h2", "h3"], ["h3"], notices.append, fleet.plans, min_hosts)
        finally:
            fleet.close()
        assert notices[0].startswith("spare host h5 failed its checks: worker:"), notices
        if left is None:  # two hosts would be left, fewer than --min-hosts 3: no plans, the run stops
            assert placement.plans is None and len(notices) == 1, notices
            continue
        assert [plan.host for plan in placement.plans] == left and placement.took == ()
        assert placement.dropped == ("h3", "h2") and fleet.spares == ()
        assert notices[1:] == ["no spare host left for h2 after a spare failed its checks: the run goes on without it "
                               "(--min-hosts 2)"]
        assert [(p.name, p.env["WORLD_SIZE"], p.env["MGPU_WORLD_SIZE_MAX"]) for p in placement.plans] == [
            ("worker:0", "2", "4"), ("worker:1", "2", "4")]
