"""The stall watchdog over SSH: on two network-namespace hosts, a TensorFlow job whose worker:1
blocks in Python is stopped, worker:1 is named with its stack, and nothing is left running."""

from __future__ import annotations

import os
import subprocess

import pytest

from ssh_helpers import PYTHON, REPO, run_processes, unique_run_id
from test_netns import netns  # noqa: F401  (the two hosts, as a fixture)

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_remote_worker_blocked_in_python_is_named_with_its_stack(netns, tmp_path):  # noqa: F811
    pytest.importorskip("tensorflow")
    lab, known, config, _ = netns
    run_id = unique_run_id("netns-stall")
    env = {**os.environ}
    env.pop("SSH_AUTH_SOCK", None)
    # Over SSH only output counts as progress: the timeout leaves room for TensorFlow's silent start.
    done = subprocess.run(
        [PYTHON, "-m", "launcher", "launch", "--workers", "h1:2222,h2:2222", "--ssh-config", str(config),
         "--known-hosts", str(known), "--workdir", str(tmp_path), "--run-id", run_id, "--no-check",
         "--log-dir", str(tmp_path / "runs"), "--stall-timeout", "20", "--grace-period", "2",
         "--threads-per-task", "1", "--", PYTHON, str(REPO / "tests" / "programs" / "mwms_stuck.py"), "1", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines[0].startswith("mgpu: error: stall: no training task made progress for "), done.stderr
    assert lines[0].endswith("; likely cause: worker:1, in its own code while the others wait"), done.stderr
    assert "worker:0 on h1: waiting in tensorflow" in lines
    at = lines.index("worker:1 on h2: in its own code, not in a collective")
    assert any("mwms_stuck.py:" in line and line.endswith(" in next_batch") for line in lines[at:]), done.stderr
    assert not run_processes(run_id)
