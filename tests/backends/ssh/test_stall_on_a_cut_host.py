"""A stall whose cause is a host cut off: its tasks can never send their stacks, so the stall's
evidence asks every host whether it answers first (evidence.AskHosts), judges the silent one lost at
once and waits for nothing from its tasks, instead of waiting out the stacks' timeout (or the
connection's keepalives, 45 s and more at their default interval)."""

from __future__ import annotations

import datetime
import json
import subprocess
import time

import pytest

import lab_mgpu
from launching import REPO, wait_for, wait_for_line
from netns_hosts import ip, lose
from ssh_helpers import PYTHON, run_processes, unique_run_id
from launcher.supervise import evidence

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(120)]

PROGRAM = str(REPO / "tests" / "programs" / "lockstep.py")
HOLD_AT = 2  # the workers wait after this step in the first attempt: a stall, once h2 is cut off


@pytest.fixture
def two_hosts(lab_of_three):
    yield lab_of_three.lab, lab_of_three.known, lab_of_three.config
    lab_of_three.bring_back(["h2"])


def test_a_stall_with_a_host_cut_off_charges_it_without_waiting_for_its_stacks(two_hosts, tmp_path):
    lab, known, config = two_hosts
    run_id = unique_run_id("cut")
    folder = tmp_path / "shared"
    folder.mkdir()
    console = tmp_path / "console.txt"
    # The keepalives at their default interval: only asking the hosts tells a cut one in time.
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", "h1:2222,h2:2222", "--max-restarts", "0",
                          "--ssh-config", str(config), "--known-hosts", str(known), "--stall-timeout", "2",
                          "--connect-timeout", "2", "--grace-period", "1", "--no-check", "--workdir", str(tmp_path),
                          "--run-id", run_id, "--", PYTHON, PROGRAM, str(folder), "6", str(HOLD_AT),
                          stdout=console.open("w"), stderr=subprocess.STDOUT, text=True)
    try:
        checkpoint = folder / "step"
        wait_for(lambda: checkpoint.exists() and checkpoint.read_text() == str(HOLD_AT) or proc.poll() is not None,
                 60, f"step {HOLD_AT}")
        wait_for_line(console, "all 2 tasks ready", 60, proc)  # the stall clock runs from then on
        ip("-n", lab.namespaces["h2"], "link", "set", "eth0", "down")
        cut_at = time.time()
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
        lose(lab, "h2")  # its task, which no SSH session reaches any more
    out = console.read_text()
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    attempt = record["attempts"][0]
    assert (attempt["cause"], attempt["task"], attempt["host"]) == ("host-lost", "worker:1", "h2"), out
    assert "h2 not answering: not waiting for the stacks of its tasks" in out
    ended = datetime.datetime.fromisoformat(attempt["ended_at"]).timestamp()
    assert ended - cut_at < evidence.STACKS_TIMEOUT, out
    assert code != 0
    wait_for(lambda: not run_processes(run_id), 10, "the run's processes gone")
