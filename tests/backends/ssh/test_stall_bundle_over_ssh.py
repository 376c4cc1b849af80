"""A stall over SSH hosts: the stall's folder has each host's `nvidia-smi -q` (a fake nvidia-smi on
the tasks' PATH that prints a recorded query), asked for over the run's own connections while the
tasks still ran."""

from __future__ import annotations

import os

import pytest

import lab_mgpu
from launching import REPO
from launcher.host.ports import pick_free_ports
from ssh_helpers import PYTHON, run_processes, unique_run_id
from test_launch_over_ssh import ssh_args

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(110)]

FAKE_WORKER = REPO / "tests" / "programs" / "fake_worker.py"
FAKE_GPU_BIN = REPO / "tests" / "programs" / "fake_gpu_bin"


def test_a_stall_keeps_each_remote_hosts_nvidia_smi_query(ssh_lab, tmp_path):
    run_id = unique_run_id("bundle")
    runs = tmp_path / "runs"
    port_a, port_b = pick_free_ports(2)
    done = lab_mgpu.run(tmp_path, "launch", "--workers", f"sshd-a:{port_a},sshd-b:{port_b}", *ssh_args(ssh_lab),
                        "--run-id", run_id, "--log-dir", str(runs), "--grace-period", "2", "--no-check",
                        "--stall-timeout", "2", "--env", f"PATH={FAKE_GPU_BIN}:{os.environ['PATH']}", "--", PYTHON,
                        str(FAKE_WORKER), "--ready", "--forever", timeout=100)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stall: no training task made progress" in done.stderr
    kept = runs / run_id / "stall-0" / "nvidia-smi"
    assert sorted(p.name for p in kept.iterdir()) == ["sshd-a.txt", "sshd-b.txt"], done.stderr
    for host in ("sshd-a", "sshd-b"):
        assert (kept / f"{host}.txt").read_text() == (FAKE_GPU_BIN / "nvidia_smi_q.txt").read_text()
    assert not run_processes(run_id)
