"""A stall over SSH hosts: the stall's folder has each host's `nvidia-smi -q` (a fake nvidia-smi on
the tasks' PATH that prints a recorded query), asked for over the run's own connections while the
tasks still ran; and a torch gloo job whose rank 1 blocks has each rank's flight recorder fetched
from its host through the run's connection (the worker server's socket is there) and analysed,
rank 1 named by the verdict."""

from __future__ import annotations

import json
import os

import pytest

import lab_mgpu
import needs
from launching import REPO
from launcher.host.ports import pick_free_ports
from ssh_helpers import PYTHON, run_processes, unique_run_id
from ssh_tasks import ssh_args

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(110)]

FAKE_WORKER = REPO / "tests" / "programs" / "fake_worker.py"
TORCH_BLOCKED_RANK = REPO / "tests" / "programs" / "torch_blocked_rank.py"
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


def test_a_remote_ranks_flight_recorder_is_fetched_through_the_run_and_names_the_blocked_rank(ssh_lab, tmp_path):
    needs.installed_version("torch", "the train extra")
    needs.installed_version("py-spy")
    run_id = unique_run_id("bundle-fr")
    runs = tmp_path / "runs"
    done = lab_mgpu.run(tmp_path, "launch", "--workers", "sshd-a,sshd-b", *ssh_args(ssh_lab), "--run-id", run_id,
                        "--log-dir", str(runs), "--workdir", str(tmp_path), "--grace-period", "2", "--no-check",
                        "--stall-timeout", "3", "--", PYTHON, str(TORCH_BLOCKED_RANK), "3", timeout=100)
    assert done.returncode == 1, done.stdout + done.stderr
    report = done.stderr.split("mgpu: error: ")[1].splitlines()
    assert ("flight recorder: worker:1 (rank 1) did not join gloo:all_reduce #9 (process group 0:default_pg), "
            "scheduled on the others") in report, report
    record = json.loads((runs / run_id / "run.json").read_text())
    assert record["attempts"][0]["flight_recorder"]["dumps"] == 2
    kept = runs / run_id / "stall-0" / "flight-recorder"
    assert sorted(p.name for p in kept.iterdir()) == ["analyzer.txt", "rank_0.json", "rank_1.json"]
    assert not list(tmp_path.glob(".mgpu-fr-*")), "the ranks' sockets are removed on their hosts"
    assert not run_processes(run_id)
