"""A task's hostile and long lines over SSH: the logs get every byte, the reader is never stopped."""

from __future__ import annotations

import json

import pytest

import lab_mgpu
from launcher.host.ports import pick_free_ports
from ssh_helpers import PYTHON, unique_run_id
from ssh_tasks import ssh_args

pytestmark = pytest.mark.ssh

PROGRAM = r"""
import json, sys
sys.stdout.write("MGPU_TASK_READY\nMGPU_PROGRESS \u00b2/3\nMGPU_PROGRESS 5/" + "9" * 400 + "\n")
sys.stdout.write("No address added out of total 1 resolved for 'x:" + "7" * 5000 + "'\n")
sys.stdout.write(json.dumps({"values": list(range(50000))}) + "\n")
sys.stdout.write("".join(f"{i}\n" for i in range(1, 20001)))
"""


def expected_log() -> bytes:
    return ("MGPU_TASK_READY\nMGPU_PROGRESS \u00b2/3\nMGPU_PROGRESS 5/" + "9" * 400 + "\n"
            + "No address added out of total 1 resolved for 'x:" + "7" * 5000 + "'\n"
            + json.dumps({"values": list(range(50000))}) + "\n"
            + "".join(f"{i}\n" for i in range(1, 20001))).encode()


def test_hostile_and_long_lines_reach_the_logs_over_ssh(ssh_lab, tmp_path):
    run_id = unique_run_id("hostile")
    port_a, port_b = pick_free_ports(2)
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port_a},sshd-b:{port_b}", *ssh_args(ssh_lab),
                          "--run-id", run_id, "--grace-period", "3", "--no-check", "--", PYTHON, "-c", PROGRAM)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    expected = expected_log()
    for index in (0, 1):
        log = (tmp_path / "mgpu-runs" / run_id / f"worker-{index}.log").read_bytes()
        if log != expected:  # not a plain assert: pytest's diff of two 600 KB strings takes minutes
            at = next((i for i, (a, b) in enumerate(zip(log, expected)) if a != b), min(len(log), len(expected)))
            pytest.fail(f"worker-{index}.log differs at byte {at} of {len(expected)} ({len(log)} logged): "
                        f"{log[max(0, at - 80):at + 80]!r}")
    assert b"[worker:1] 20000\n" in out and b"[mgpu] done: 2 tasks succeeded" in out
