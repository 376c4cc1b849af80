"""--setup on a host reached over SSH is a task for what it leaves behind: the remote wrapper's guard
stops whatever it started, setsid children too, once its session ends (it succeeded, failed, or mgpu
was stopped), as it does for a task."""

from __future__ import annotations

import pathlib
import signal

import psutil
import pytest

import lab_mgpu
from launcher.host.ports import pick_free_ports
from launching import wait_for
from ssh_helpers import PYTHON, run_processes, unique_run_id
from ssh_tasks import ssh_args

pytestmark = pytest.mark.ssh

# Started by the setup in a session of its own, away from the setup's process group.
SETSID_CHILD = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > child.pid"


def running(pid_file: pathlib.Path) -> psutil.Process | None:
    """The process whose pid the file holds, while it runs (the sshd hosts are this machine)."""
    try:
        proc = psutil.Process(int(pid_file.read_text()))
        return proc if proc.status() != psutil.STATUS_ZOMBIE and proc.cmdline()[:1] == ["sleep"] else None
    except (OSError, ValueError, psutil.Error):
        return None


def launch_args(ssh_lab, tmp_path, run_id: str, setup: str) -> list[str]:
    return ["launch", "--workers", f"sshd-a:{pick_free_ports(1)[0]}", *ssh_args(ssh_lab), "--run-id", run_id,
            "--grace-period", "1", "--no-check", "--workdir", str(tmp_path), "--setup", setup,
            "--", PYTHON, "-c", "pass"]


@pytest.fixture
def child_file(tmp_path):
    """Where the setup writes its child's pid; the child is killed at the end if it still runs."""
    path = tmp_path / "child.pid"
    yield path
    if (proc := running(path)) is not None:
        proc.kill()


@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
def test_a_remote_setup_leaves_no_setsid_child(ssh_lab, tmp_path, child_file, outcome):
    run_id = unique_run_id("setup-child")
    setup = SETSID_CHILD + ("; exit 3" if outcome == "fails" else "")
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, tmp_path, run_id, setup))
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == (0 if outcome == "succeeds" else 1), err.decode()
    assert child_file.exists()
    # The guard acts once the setup's session has ended, and gives TERM a second (--grace-period).
    wait_for(lambda: running(child_file) is None, 30, "the setup's setsid child to end")
    assert not run_processes(run_id)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_mgpu_stops_a_remote_setup_and_its_setsid_child(ssh_lab, tmp_path, child_file, signum):
    run_id = unique_run_id("setup-signal")
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, tmp_path, run_id, SETSID_CHILD + "; exec sleep 1000"))
    try:
        wait_for(lambda: running(child_file) or proc.poll() is not None, 60, "the setup's child")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, err.decode()
    assert f"mgpu: error: interrupted by signal {signum}" in err.decode()
    wait_for(lambda: running(child_file) is None, 30, "the setup's setsid child to end")
    wait_for(lambda: not run_processes(run_id), 30, "the setup's processes to end")
