"""Five hosts, each in a network namespace of its own with its own sshd, and a run on three of them
(h1, h2, h3; h4 and h5 are spares) that loses hosts on cue: the lab of test_two_hosts_lost.py and
test_peer_lost_beside_a_spare.py (two files, so that two test processes share their waits)."""

from __future__ import annotations

import json
import subprocess

import pytest

import lab_mgpu
from launching import REPO, finish, wait_for
from netns_hosts import ip, lose
from ssh_helpers import PYTHON, run_processes, unique_run_id

HOSTS = ("h1", "h2", "h3", "h4", "h5")

# The workers step in lockstep, worker 0 checkpointing; in the first attempt they wait after step
# HOLD_AT, where the test loses hosts, and a restart resumes from that step's checkpoint.
PROGRAM = str(REPO / "tests" / "programs" / "lockstep.py")
TOTAL, HOLD_AT = "8", 5

# --setup: once armed (by the test), the next host to run it (a spare being made ready) says so and
# waits until the test lets it go, at most 60 s.
SETUP = ('if [ -e {d}/armed ]; then rm {d}/armed; touch {d}/held; i=0; '
         'while [ -e {d}/held ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; fi')


@pytest.fixture
def five_hosts(lab_of_five):
    """The lab, with every host brought back after the test."""
    yield lab_of_five.lab, lab_of_five.known, lab_of_five.config
    lab_of_five.bring_back(HOSTS)


def run_losing(five_hosts, tmp_path, spares: str, lost: tuple[str, ...], during_spare_setup: str | None = None):
    """Launch on h1, h2 and h3 with `spares`; once the workers wait after step HOLD_AT, lose the hosts
    `lost` together, and with `during_spare_setup`, lose that host too once a spare runs --setup.
    (exit code, output, run.json)."""
    lab, known, config = five_hosts
    run_id = unique_run_id("lost")
    folder = tmp_path / "shared"
    folder.mkdir()
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", "h1:2222,h2:2222,h3:2222", "--spare-hosts", spares,
                          "--max-restarts", "2", "--ssh-config", str(config), "--known-hosts", str(known),
                          "--keepalive", "1", "--connect-timeout", "6", "--grace-period", "2", "--workdir",
                          str(tmp_path), "--setup", SETUP.format(d=folder), "--run-id", run_id, "--", PYTHON, PROGRAM,
                          str(folder), TOTAL, str(HOLD_AT), stderr=subprocess.STDOUT, text=True)
    try:
        checkpoint = folder / "step"
        wait_for(lambda: checkpoint.exists() and checkpoint.read_text() == str(HOLD_AT) or proc.poll() is not None,
                 120, f"step {HOLD_AT}")
        if during_spare_setup:
            (folder / "armed").touch()
        for name in lost:
            ip("-n", lab.namespaces[name], "link", "set", "eth0", "down")
        for name in lost:
            lose(lab, name)
        if during_spare_setup:
            wait_for(lambda: (folder / "held").exists() or proc.poll() is not None, 120, "a spare's --setup")
            lose(lab, during_spare_setup)
            (folder / "held").unlink(missing_ok=True)
        code, out = finish(proc, 200)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert not run_processes(run_id)
    return code, out, record
