"""The speed probe on this machine: real numpy products, a real transfer between two listeners,
and `mgpu check` showing the figures. How fast this machine is is never asserted: only that the
figures were measured and go where they should. That equal hosts are not told apart is the pure
judgement's (test_slow_hosts.py), fed figures that differ within the margin."""

import dataclasses
import json
import subprocess
import sys

import pytest

from launcher.preflight.probes import probe_source
from launcher.preflight.check import check_hosts_and_reach
from launcher.preflight.speed import slow_hosts
from launcher.host.ports import pick_free_ports
from launching import run_mgpu
from supervisor_helpers import make_plans

pytestmark = pytest.mark.timeout(120)


def probe_speeds(plans):
    """The speed probe of `plans`' hosts, in the sessions of their checks and reachability test."""
    _, _, speeds = check_hosts_and_reach([], plans, speed=True)
    return speeds


def test_two_hosts_on_this_machine_send_to_each_other_and_compute(run_id):
    # Two host names for this machine, each a host of the ring: 127.0.0.1 and 127.0.0.2 (loopback too).
    plans = make_plans(run_id, [], workers=2)
    plans[1] = dataclasses.replace(plans[1], host="127.0.0.2", address="127.0.0.2")
    speeds = probe_speeds(plans)
    assert [speed.host for speed in speeds] == ["127.0.0.1", "127.0.0.2"]
    for speed in speeds:
        assert speed.problems == ()
        assert speed.cpu_gflops > 0 and speed.send_mbps > 0 and speed.gpu_gflops is None
    # Each host's receiving figure is what the other one measured sending.
    assert speeds[0].receive_mbps == speeds[1].send_mbps and speeds[1].receive_mbps == speeds[0].send_mbps
    # Of two hosts the network names neither (a slow link has two ends: test_slow_hosts.py); their
    # compute shares this machine's cores at once, so which host is faster here is chance, and
    # whether equal hosts are told apart is the pure judgement's to prove (test_slow_hosts.py).
    assert not [slow for slow in slow_hosts(speeds) if slow.figure != "compute"]


def test_a_neighbour_that_cannot_be_sent_to_is_named_and_the_rest_still_measured(run_id):
    plans = make_plans(run_id, [], workers=2)
    plans[1] = dataclasses.replace(plans[1], host="127.0.0.2", address="no-such-host.invalid")
    first, second = probe_speeds(plans)
    assert first.send_mbps is None and first.cpu_gflops > 0
    # Why is the resolver's word ("name or service not known", or a temporary failure).
    (problem,) = first.problems
    assert problem.startswith(f"no-such-host.invalid:{plans[1].port}: "), problem
    # The second host still computed. (Nothing could dial it, so its reachability test held its
    # listener to the end and it came to the speed probe after the first had finished: the figures
    # of a cluster whose tasks cannot reach each other are not judged.)
    assert second.cpu_gflops > 0


def test_check_shows_the_figures_of_this_machine_in_its_table_and_json():
    first, second = pick_free_ports(2)
    workers = f"127.0.0.1:{first},127.0.0.1:{second}"
    done = run_mgpu("check", "--workers", workers, "--json", "--", "python3", "-c", "pass", timeout=90)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["host"] for row in report["hosts"]] == ["127.0.0.1"]  # both tasks: one host, one row
    speed = report["hosts"][0]["speed"]
    assert speed["cpu_gflops"] > 0 and speed["network_mbps"] is None and speed["slow"] == []
    assert report["slow_hosts"] == [] and report["unreachable"] == []
    table = run_mgpu("check", "--workers", workers, "--", "python3", "-c", "pass", timeout=90)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[-2:] == ["SPEED", "RESULT"] and " GFLOP/s " in row and "SLOW" not in row


def test_without_numpy_the_compute_is_unknown_and_said(tmp_path):
    # A numpy that cannot be imported, first on the probe's path (its working directory).
    (tmp_path / "numpy.py").write_text("raise ImportError('No module named numpy')\n")
    done = subprocess.run([sys.executable, "-c", probe_source(), "speed", "-", "-", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout)
    assert result["cpu_gflops"] is None and result["cpu_error"] == "no numpy for the compute figure"


def test_check_json_shows_a_failing_host_without_figures_and_exits_1():
    first, second = pick_free_ports(2)
    done = run_mgpu("check", "--workers", f"127.0.0.1:{first},127.0.0.1:{second}", "--json", "--", "/nonexistent",
                    timeout=90)
    assert done.returncode == 1
    (row,) = json.loads(done.stdout)["hosts"]
    assert row["ok"] is False and row["problems"] == ["/nonexistent not found"] and row["speed"] is None
    assert done.stderr.strip() == "mgpu: error: check failed on 127.0.0.1: /nonexistent not found"


def test_the_sender_tries_again_while_the_port_still_closes_what_it_accepts():
    # The neighbour's reachability test may still hold the port, accepting and closing: the
    # sender's first round then fails, and it tries again until the neighbour's receiver is up.
    import socket
    import threading
    import time

    from launcher.host.probe import speed_probe

    (port,) = pick_free_ports(1)
    sent = {}
    with socket.create_server(("127.0.0.1", port)) as holder:
        sender = threading.Thread(
            target=lambda: sent.update(mbps=speed_probe.send_to(f"127.0.0.1:{port}", time.monotonic() + 30)))
        sender.start()
        holder.settimeout(30)
        conn, _ = holder.accept()
        conn.close()
    receiver = subprocess.Popen([sys.executable, "-c", probe_source(), "speed", str(port), "-", "30"],
                                stdout=subprocess.PIPE, text=True)
    try:
        sender.join(60)
        out, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
    assert sent["mbps"] > 0
    assert json.loads(out)["cpu_gflops"] > 0
