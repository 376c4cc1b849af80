"""A run that goes on on fewer hosts (--min-hosts): three hosts in network namespaces of their own,
each with its own sshd, run a PyTorch DDP program (gloo, CPU) with --min-hosts 2 and no spare. h1,
whose task is rank 0 and so the coordinator, dies mid-run (its link goes down and every process in
its namespace is killed): the plans are made again for h2 and h3, the coordinator moves to h2, and
the run finishes there, resumed from its checkpoint past step 0 at WORLD_SIZE 2."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from needs import require

from launching import REPO, finish, start_mgpu, wait_for
from ssh_helpers import PYTHON, ip, lose, run_processes, start_sshd, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(240)]

PROGRAM = str(REPO / "tests" / "programs" / "torch_shrink.py")


@pytest.fixture
def three_hosts(lab_of_three):
    """The lab, with h1 brought back after the test (its link up, a new sshd with the same host key)."""
    require("torch")
    lab, known, config, servers, directory, ssh_lab = lab_of_three
    yield lab, known, config
    ip("-n", lab.namespaces["h1"], "link", "set", "eth0", "up")
    if servers["h1"].proc.poll() is not None:
        servers["h1"] = start_sshd(directory, "h1", ssh_lab.authorized_keys, address=lab.hosts["h1"], port=22,
                                   netns=lab.namespaces["h1"])


def test_a_lost_host_with_no_spare_leaves_the_run_on_two_of_three_hosts(three_hosts, tmp_path):
    lab, known, config = three_hosts
    run_id = unique_run_id("shrink")
    folder = tmp_path / "shared"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    proc = start_mgpu("launch", "--workers", "h1:2222,h2:2222,h3:2222", "--min-hosts", "2", "--max-restarts", "2",
                      "--ssh-config", str(config), "--known-hosts", str(known), "--keepalive", "1",
                      "--connect-timeout", "6", "--grace-period", "2", "--workdir", str(tmp_path),
                      "--run-id", run_id, "--", PYTHON, PROGRAM, str(folder), "30", cwd=tmp_path, env=env)
    try:
        checkpoint = folder / "checkpoint.pt"
        wait_for(lambda: checkpoint.exists() and progress(tmp_path / "mgpu-runs" / run_id) >= 8
                 or proc.poll() is not None, 150, "step 8")
        lose(lab, "h1")
        code, out = finish(proc, 180)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = tmp_path / "mgpu-runs" / run_id
    record = json.loads((run_dir / "run.json").read_text())
    assert not run_processes(run_id)
    assert code == 0, out[-4000:]
    first, second = record["attempts"]
    assert (first["cause"], first["host"]) == ("host-lost", "h1"), first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {"worker:0": "h2", "worker:1": "h3"}
    # The output names the lost host and the new size; the tasks left were renumbered.
    assert "no spare host for h1: the run goes on on 2 of 3 hosts (--min-hosts 2), 2 tasks in place of 3; " \
           "worker:1 is worker:0 now; worker:2 is worker:1 now" in out, out[-4000:]
    [change] = record["size_changes"]
    assert (change["dropped"], change["hosts"], change["tasks"]) == (
        ["h1"], {"from": 3, "to": 2, "planned": 3}, {"from": 3, "to": 2})
    # WORLD_SIZE seen to change (the planned size stays), and the second attempt resumed past step 0.
    worlds = re.findall(r"world (\d) of (\d), rank (\d)", out)
    assert sorted(set(worlds)) == [("2", "3", "0"), ("2", "3", "1"), ("3", "3", "0"), ("3", "3", "1"),
                                   ("3", "3", "2")], worlds
    starts = [int(n) for n in re.findall(r"start step (\d+)", (run_dir / "worker-0.log").read_text())]
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 8, starts
    closing = out.splitlines()[-1]
    assert closing.startswith("[mgpu] done: 2 tasks succeeded in ") and "; 1 restart (h1 lost at " in closing, closing
    assert "; ran on 2 of 3 hosts for " in closing, closing
    status = subprocess.run([PYTHON, "-m", "launcher", "status", run_id], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert re.search(r"^size: 2 of 3 hosts since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(UTC\)$", status.stdout, re.M), \
        status.stdout


def progress(run_dir) -> int:
    """The highest step any task of the run's record reported (0 before any)."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return 0
    steps = [task.get("progress", {}).get("step", 0) for attempt in record["attempts"][-1:]
             for task in attempt["tasks"].values() if task.get("progress")]
    return max(steps, default=0)
