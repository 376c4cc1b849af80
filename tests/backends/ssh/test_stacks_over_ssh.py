"""`mgpu stacks` on a run over SSH: py-spy reads each remote task's processes on its host, over the
run's own connection, and the run goes on to succeed."""

from __future__ import annotations

import pytest

import lab_mgpu
import needs
from launching import REPO, wait_for
from launcher.host.ports import pick_free_ports
from ssh_helpers import PYTHON, run_processes, unique_run_id
from ssh_tasks import ssh_args

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(120)]

WAITS_FOR_GO = REPO / "tests" / "programs" / "waits_for_go.py"
SETSID_CHILD = REPO / "tests" / "programs" / "setsid_child.py"


def test_stacks_of_remote_tasks_are_read_on_their_hosts_and_the_run_then_succeeds(ssh_lab, tmp_path):
    needs.installed_version("py-spy")
    run_id = unique_run_id("stacks")
    go, runs = tmp_path / "go", tmp_path / "runs"
    port_a, port_b = pick_free_ports(2)
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port_a},sshd-b:{port_b}", *ssh_args(ssh_lab),
                          "--run-id", run_id, "--log-dir", str(runs), "--grace-period", "2", "--no-check", "--", PYTHON,
                          str(WAITS_FOR_GO), str(go))
    try:
        logs = [runs / run_id / f"worker-{i}.log" for i in range(2)]
        wait_for(lambda: all(log.exists() and "waiting" in log.read_text() for log in logs), 60, "both tasks waiting")
        asked = lab_mgpu.start(tmp_path, "stacks", run_id, "--log-dir", str(runs), text=True)
        out, err = asked.communicate(timeout=100)
        assert asked.returncode == 0, err
        for index, host in enumerate(("sshd-a", "sshd-b")):
            section = out.split(f"===== worker:{index} on {host} =====\n")[1].split("=====")[0]
            assert f"{WAITS_FOR_GO}:" in section and " in waits_for_go\n" in section, out
        go.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not run_processes(run_id), 30, lambda: str(run_processes(run_id)))


def test_a_remote_tasks_child_in_a_session_of_its_own_is_read_too(ssh_lab, tmp_path):
    needs.installed_version("py-spy")
    run_id = unique_run_id("stacks-setsid")
    go, runs = tmp_path / "go", tmp_path / "runs"
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{pick_free_ports(1)[0]}", *ssh_args(ssh_lab),
                          "--run-id", run_id, "--log-dir", str(runs), "--grace-period", "2", "--no-check", "--", PYTHON,
                          str(SETSID_CHILD), str(go))
    try:
        log = runs / run_id / "worker-0.log"
        wait_for(lambda: log.exists() and "child waiting" in log.read_text() and "parent waiting" in log.read_text(),
                 60, "the task and its child waiting")
        asked = lab_mgpu.start(tmp_path, "stacks", run_id, "--log-dir", str(runs), text=True)
        out, err = asked.communicate(timeout=100)
        assert asked.returncode == 0, err
        assert " in parent_waits_for_go\n" in out and " in child_in_its_own_session\n" in out, out
        go.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: not run_processes(run_id), 30, lambda: str(run_processes(run_id)))
