"""The preflight reachability probe on this machine: real listeners, real connections, and
`mgpu launch` refusing to start when a task cannot reach another."""

import dataclasses
import json
import subprocess
import sys

import psutil
import pytest

from launcher.errors import CheckFailed
from launcher.host import proctree
from launcher.preflight import reach
from launcher.preflight.probes import probe_source, reach_args
from launcher.preflight.reach import check_reachability, probe_reachability
from launching import run_mgpu
from supervisor_helpers import FAKE_WORKER, make_plans

pytestmark = pytest.mark.timeout(60)


def kill_probes(plans) -> None:
    """Stop a probe still waiting (its test timed out): its command line names the ports."""
    ports = ",".join(str(plan.port) for plan in plans if plan.port is not None)
    for process in proctree.every_process():
        try:
            if f" reach {ports} " in " ".join(process.cmdline()):
                process.kill()
        except psutil.Error:
            continue


def test_local_tasks_reach_each_other(run_id, monkeypatch):
    # Timeouts of an hour: the probe answers within the test's 60 s only if every connection was made
    # and every listener got all of its own, not by waiting out a timeout.
    monkeypatch.setattr(reach, "REACH_TIMEOUT", 3600.0)
    monkeypatch.setattr(reach, "_RUN_TIMEOUT", 7200.0)
    plans = make_plans(run_id, [], workers=3, chief=True, evaluator=True)
    try:
        assert probe_reachability(plans).problems == ()
    finally:
        kill_probes(plans)


def test_an_unresolvable_address_is_named_as_soon_as_every_host_has_dialed(run_id, monkeypatch):
    # Nobody can dial worker:1's port (its name does not resolve), so its listener never gets its
    # connection, and on its own would hold it for the hour of REACH_TIMEOUT after the dials. The
    # probe answers within the test's 60 s only because the launcher, having heard that every host
    # has dialed, tells it so (host/probe/reach_test.py: DIALED, ALL_DIALED).
    monkeypatch.setattr(reach, "REACH_TIMEOUT", 3600.0)
    monkeypatch.setattr(reach, "_RUN_TIMEOUT", 7200.0)
    plans = make_plans(run_id, [], workers=2)
    plans[1] = dataclasses.replace(plans[1], address="no-such-host.invalid")
    target = f"no-such-host.invalid:{plans[1].port}"
    try:
        problems = probe_reachability(plans).problems
        assert problems == (f"worker:0,worker:1 on 127.0.0.1 cannot resolve no-such-host.invalid (worker:1 at {target})",)
        with pytest.raises(CheckFailed) as caught:
            check_reachability(plans)
        assert str(caught.value).splitlines()[-1].startswith("hint: the tasks dial each other")
    finally:
        kill_probes(plans)


def test_launch_refuses_to_start_when_a_name_does_not_resolve(tmp_path):
    from launcher.host.ports import pick_free_ports

    first, second = pick_free_ports(2)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"cluster:\n  worker: [127.0.0.1:{first}, 127.0.0.1:{second}]\n"
                    "hosts:\n  127.0.0.1: {address: no-such-host.invalid}\n")
    done = run_mgpu("launch", "--spec", str(spec), "--log-dir", str(tmp_path / "runs"), "--", *FAKE_WORKER,
                    "--lines", "1")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "mgpu: error: tasks cannot reach each other:"
    assert (f"worker:0,worker:1 on 127.0.0.1 cannot resolve no-such-host.invalid "
            f"(worker:1 at no-such-host.invalid:{second})") in lines
    assert lines[-1].startswith("hint: ")
    assert not list((tmp_path / "runs").glob("*/worker-0.log"))  # nothing started


def test_the_host_check_and_the_reachability_test_share_one_probe_per_host(run_id, monkeypatch):
    from launcher.preflight.check import check_hosts_and_reach
    from launcher.preflight.on_host import HostShell

    commands = []
    run = HostShell.run

    def counted(self, plan, command, *args, **kwargs):
        commands.append(command)
        return run(self, plan, command, *args, **kwargs)

    monkeypatch.setattr(HostShell, "run", counted)
    plans = make_plans(run_id, [], workers=2)  # one host: 127.0.0.1
    reports, reachability, _ = check_hosts_and_reach(plans, plans)
    assert len(commands) == 1  # one session (here a subprocess) for both
    assert [(r.host, r.ok, r.tasks) for r in reports] == [("127.0.0.1", True, ("worker:0", "worker:1"))]
    assert reachability.problems == ()
    assert set(reachability.interfaces) == {"worker:0", "worker:1"}


def test_a_large_cluster_dials_every_pair_of_hosts_and_every_port_but_not_every_task(run_id):
    from launcher.preflight.reach import FULL_TEST_TASKS, ReachTest

    hosts, per_host = 12, 8  # 96 tasks: above FULL_TEST_TASKS
    assert hosts * per_host > FULL_TEST_TASKS
    plans = [dataclasses.replace(plan, host=f"h{i // per_host}", address=f"h{i // per_host}", port=2222 + i % per_host,
                                 local=False)
             for i, plan in enumerate(make_plans(run_id, [], workers=hosts * per_host))]
    test = ReachTest.of(plans)
    assert len(test.hosts) == hosts
    owner = {f"{plan.address}:{plan.port}": plan.host for plan in plans}
    for i, dials in enumerate(test.dials):
        assert len(dials) == (hosts - 1) + 2 * per_host - 1  # not every one of the 96 tasks
        assert {owner[target] for target in dials} == {host.first.host for host in test.hosts}  # every host
    dialed_from_elsewhere = {target for i, dials in enumerate(test.dials) for target in dials
                             if owner[target] != test.hosts[i].first.host}
    assert dialed_from_elsewhere == set(owner)  # every port, from another host
    for i in range(hosts):  # each listener waits for as many as dial it
        assert sum(test.expected(i)) == sum(target in test.dials[j] for j in range(hosts) for target in owner
                                            if owner[target] == test.hosts[i].first.host)


def test_a_probe_that_ends_before_the_launchers_word_exits_cleanly():
    """The reachability probe listens for ALL_DIALED on its stdin from a thread. When it ends first (here
    it dials nothing, and nothing dials it), with its stdin still open, it exits 0: the thread must
    not hold the interpreter's stdin, which made it abort at exit (SIGABRT, where a host may keep a
    core file)."""
    proc = subprocess.Popen([sys.executable, "-c", probe_source(), *reach_args([], [], 1.0, [0])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        code = proc.wait(60)
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    assert code == 0 and err == b"", err.decode()
    assert json.loads(out.splitlines()[-1])["reach"] == {}
