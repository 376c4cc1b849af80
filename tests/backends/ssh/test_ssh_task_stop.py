"""SshBackend stops a remote task's whole tree: by signal, when the connection or the launcher is lost, past a slow host."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading

import psutil
import pytest

from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launcher.host import proctree
from launching import wait_for
from ssh_helpers import PYTHON, run_processes, start_sshd, unique_run_id
from ssh_tasks import drain, plan, wait_exit

pytestmark = pytest.mark.ssh


def test_signal_tree_kills_the_remote_tree_and_reports_the_signal(runner):
    signal_tree_id = unique_run_id("signal_tree")
    program = ("import subprocess, sys, time\n"
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
               "print('up', flush=True); time.sleep(300)\n")
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", program], run_id=signal_tree_id), attempt=0)
    assert proc.stdout.readline() == b"up\n"
    wait_for(lambda: len(run_processes(signal_tree_id)) >= 2, 10)
    proc.signal_tree(signal.SIGTERM)
    assert wait_exit(proc) == -signal.SIGTERM
    wait_for(lambda: not run_processes(signal_tree_id), 10)
    proc.signal_tree(signal.SIGKILL)  # gone: a no-op
    proc.close()


def test_lost_connection_kills_the_remote_tree(runner):
    drop_id = unique_run_id("drop")
    program = ("import signal, subprocess, sys, time\n"
               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # only KILL ends it
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
               "print('up', flush=True); time.sleep(300)\n")
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", program], run_id=drop_id), attempt=0)
    assert proc.stdout.readline() == b"up\n"
    conn = runner.connect(plan("sshd-a", ["true"]))
    conn.transport.sock.shutdown(socket.SHUT_RDWR)  # the network goes away under the transport
    assert wait_exit(proc, 15) == 255
    _, err = drain(proc)
    assert b"lost the SSH connection" in err
    wait_for(lambda: not run_processes(drop_id), 15)
    proc.close()


LAUNCHER_SCRIPT = """
import sys, time
from launcher.plan.planner import TaskPlan
from launcher.backends.ssh.backend import SshBackend
from launcher.backends.ssh.options import SshOptions
from launcher.config.spec import SshSettings
runner = SshBackend(SshOptions(known_hosts=sys.argv[1], ssh_config=sys.argv[2]), grace_period=2)
program = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); print('up', flush=True); time.sleep(300)"
plan = TaskPlan("worker", 0, "sshd-a", 2222, False, SshSettings(), (sys.executable, "-c", program),
                {"TF_CONFIG": "{}", "MGPU_RUN_ID": sys.argv[3]}, None, False)
proc = runner.start(plan, 0)
print(proc.stdout.readline().decode().strip(), flush=True)
time.sleep(300)
"""


def test_sigkilled_launcher_leaves_nothing_remote(ssh_lab):
    run_id = unique_run_id("sigkill")
    launcher = subprocess.Popen([PYTHON, "-c", LAUNCHER_SCRIPT, str(ssh_lab.known_hosts), str(ssh_lab.ssh_config), run_id],
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert launcher.stdout.readline() == b"up\n"
        wait_for(lambda: len(run_processes(run_id)) >= 2, 10)
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: not run_processes(run_id), 15)
    finally:
        launcher.kill()
        launcher.wait(10)


def test_unanswered_keepalives_drop_the_connection(ssh_lab, tmp_path):
    """A server that stops answering (a network partition) is given up after 3 keepalives;
    once it can see the connection is gone, its sshd ends the session and the hang-up guard kills the task.

    A keepalive counts as unanswered after 3 intervals: at 1 s, a loopback sshd gets 3 s to answer
    each (a busy machine's sshd answers in milliseconds; a frozen one never does)."""
    partition_id = unique_run_id("partition")
    server = start_sshd(tmp_path, "frozen", ssh_lab.authorized_keys)
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    runner = SshBackend(ssh_lab.options(known_hosts=str(known), keepalive=1.0), grace_period=2)
    try:
        settings = SshSettings(port=server.port, identity_file=str(ssh_lab.client_key))
        task = plan("127.0.0.1", [PYTHON, "-c", "import time; print('up', flush=True); time.sleep(300)"],
                    ssh=settings, run_id=partition_id)
        proc = runner.start(task, attempt=0)
        assert proc.stdout.readline() == b"up\n"
        conn = runner.connect(task)
        conn.release()
        # Answered keepalives keep the connection, past the 3 intervals that unanswered ones last.
        wait_for(lambda: conn.keepalives_answered >= 4, 60)
        assert proc.poll() is None and conn.active
        with server.frozen():
            assert wait_exit(proc, 60) == 255
            assert b"lost the SSH connection" in drain(proc)[1]
            assert run_processes(partition_id)  # unreachable, so still running over there ...
        wait_for(lambda: not run_processes(partition_id), 15)  # ... until sshd notices
        proc.close()
    finally:
        runner.close()
        server.stop()


def test_signalling_tasks_does_not_wait_for_a_slow_host(ssh_lab, tmp_path):
    """signal_tree returns at once while the host does not answer; the signals for every task
    go out when it answers again."""
    server = start_sshd(tmp_path, "slow", ssh_lab.authorized_keys)
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    runner = SshBackend(ssh_lab.options(known_hosts=str(known), keepalive=0, connect_timeout=30), grace_period=2)
    run_id = unique_run_id("slow-stop")
    try:
        settings = SshSettings(port=server.port, identity_file=str(ssh_lab.client_key))
        program = "import time; print('up', flush=True); time.sleep(300)"
        procs = [runner.start(plan("127.0.0.1", [PYTHON, "-c", program], ssh=settings, run_id=run_id, index=i), attempt=0)
                 for i in range(3)]
        for proc in procs:
            assert proc.stdout.readline() == b"up\n"
        with server.frozen():
            stopper = threading.Thread(target=lambda: [proc.signal_tree(signal.SIGTERM) for proc in procs], daemon=True)
            stopper.start()
            stopper.join(10)
            assert not stopper.is_alive(), "signal_tree waited for the host"
            assert all(proc.poll() is None for proc in procs)
        assert [wait_exit(proc, 30) for proc in procs] == [-signal.SIGTERM] * 3
        wait_for(lambda: not run_processes(run_id), 15)
        for proc in procs:
            proc.close()
    finally:
        runner.close()
        server.stop()


# A task whose child leaves the session (setsid) and ignores SIGTERM: only SIGKILL ends it, and only
# the remote hang-up guard can find it, by its tags. The child prints its pid once it ignores TERM.
STUBBORN_ESCAPEE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(os.getpid(), flush=True); time.sleep(300)'], start_new_session=True)\n"
    "time.sleep(300)\n"
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stopped_task_leaves_no_escapee_that_ignores_term(runner):
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", STUBBORN_ESCAPEE]), attempt=0)
    child = int(proc.stdout.readline())
    try:
        assert os.getsid(child) != proc.pid  # out of the group's reach
        proc.signal_tree(signal.SIGTERM)
        assert wait_exit(proc) == -signal.SIGTERM
        proc.signal_tree(signal.SIGKILL)
        proc.close()  # the session ends: the hang-up guard TERMs, waits the grace period (2 s), then KILLs
        wait_for(lambda: gone(child), 20)
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


ESCAPEE_LAUNCHER_SCRIPT = """
import sys, time
from launcher.plan.planner import TaskPlan
from launcher.backends.ssh.backend import SshBackend
from launcher.backends.ssh.options import SshOptions
from launcher.config.spec import SshSettings
runner = SshBackend(SshOptions(known_hosts=sys.argv[1], ssh_config=sys.argv[2]), grace_period=2)
env = {"TF_CONFIG": "{}", "MGPU_RUN_ID": sys.argv[3], "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": "0"}
plan = TaskPlan("worker", 0, "sshd-a", 2222, False, SshSettings(), (sys.executable, "-c", sys.argv[4]), env, None, False)
proc = runner.start(plan, 0)
print(proc.stdout.readline().decode().strip(), flush=True)
time.sleep(300)
"""


def test_sigkilled_launcher_leaves_no_escapee_that_ignores_term(ssh_lab):
    launcher = subprocess.Popen([PYTHON, "-c", ESCAPEE_LAUNCHER_SCRIPT, str(ssh_lab.known_hosts),
                                 str(ssh_lab.ssh_config), unique_run_id("sigkill-escapee"), STUBBORN_ESCAPEE],
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = None
    try:
        child = int(launcher.stdout.readline())
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: gone(child), 20)
    finally:
        launcher.kill()
        launcher.wait(10)
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("host_agent", [False, True], ids=["own-session", "host-agent"])
def test_a_stopped_task_ends_on_the_hang_up_guards_term_not_after_the_grace_period(ssh_lab, host_agent):
    """A task stopped (SIGSTOP, Ctrl-Z) when its session ends takes the guard's SIGTERM at once, though
    the grace period before the KILL is two minutes."""
    backend = SshBackend(ssh_lab.options(host_agent=host_agent), grace_period=120)
    task = None
    try:
        proc = backend.start(plan("sshd-a", [PYTHON, "-c", "import os, time; print(os.getpid(), flush=True); "
                                                           "time.sleep(300)"], run_id=unique_run_id("stopped")), 0)
        task = psutil.Process(int(proc.stdout.readline()))
        task.suspend()
        wait_for(lambda: task.status() == psutil.STATUS_STOPPED, 10, what="the task stopped")
        proc.close()
        wait_for(lambda: not proctree.is_alive(task), 60, what="the stopped task to end")
    finally:
        backend.close()
        if task is not None:
            proctree.send([task], signal.SIGKILL)
