"""`mgpu launch` over SSH: a run's tasks start together, in the checks' session, log byte-exact and end with the run."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

import lab_mgpu
from launcher.host import proctree
from launcher.host.ports import pick_free_ports
from launching import wait_for
from ssh_helpers import PYTHON, run_processes, unique_run_id
from ssh_tasks import _PER_LAUNCH, SESSION_COMMAND, forced_host, launch_args, ssh_args

pytestmark = pytest.mark.ssh


def wait_for_both_tasks_hanging(proc, run_id: str) -> None:
    """Until both remote tasks print "hanging" (at most 60 s) and each has its child running."""
    hanging = 0
    deadline = time.monotonic() + 60
    while hanging < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()
        hanging += b"hanging" in line
    assert hanging == 2
    wait_for(lambda: len(run_processes(run_id)) >= 4, 10)  # two tasks, each with a child


def test_two_task_cluster_over_ssh(ssh_lab, tmp_path):
    run_id = unique_run_id("two-ok")
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, run_id, "--no-check"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "task 0 0" in text and "task 1 1" in text
    assert "warning" not in err.decode()  # loopback addresses are not exposed
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert record["status"] == "succeeded"
    logs = sorted(p.name for p in (tmp_path / "mgpu-runs" / run_id).glob("*.log"))
    assert "worker-0.log" in logs and "worker-1.log" in logs
    assert not run_processes(run_id)


def test_a_failing_task_stops_the_remote_cluster(ssh_lab, tmp_path):
    env_args = ["--env", "MODE_0=fail", "--env", "MODE_1=hang"]
    run_id = unique_run_id("fail-fast")
    started = time.monotonic()
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, run_id, "--no-check", *env_args))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    assert "mgpu: error: worker:0 on sshd-a" in err.decode()
    assert time.monotonic() - started < 60
    wait_for(lambda: not run_processes(run_id), 10)


def test_sigint_stops_the_remote_cluster(ssh_lab, tmp_path):
    env_args = ["--env", "MODE_0=hang", "--env", "MODE_1=hang"]
    run_id = unique_run_id("sigint")
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, run_id, "--no-check", *env_args))
    try:
        wait_for_both_tasks_hanging(proc, run_id)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        wait_for(lambda: not run_processes(run_id), 10)
    finally:
        proc.kill()
        proc.wait(10)


def test_a_remote_tasks_stderr_reaches_its_log_byte_exact(ssh_lab, tmp_path):
    """Text that looks like the remote wrapper's reports is the task's own, and stays in its log."""
    run_id = unique_run_id("byte-exact")
    (port,) = pick_free_ports(1)
    text = b"abcMGPU_REMOTE_LISTENING\ndef\nMGPU_REMOTE_PGID 1\nlistening\nconnected\n\x1emgpu-0123456789abcdef usage 1 2 3\n"
    program = f"import sys; sys.stderr.buffer.write({text!r})"
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port}", *ssh_args(ssh_lab), "--run-id", run_id,
                          "--no-check", "--", PYTHON, "-c", program)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "mgpu-runs" / run_id / "worker-0.log").read_bytes() == text


def test_a_sigkilled_launcher_of_an_ssh_only_run_is_recorded_as_died(ssh_lab, tmp_path):
    """kill -9 of mgpu: its reaper marks run.json launcher-died, and the remote tasks end once
    their sessions close."""
    run_id = unique_run_id("launcher-died")
    proc = lab_mgpu.start(tmp_path,
                          *launch_args(ssh_lab, run_id, "--no-check", "--env", "MODE_0=hang",                                                 "--env", "MODE_1=hang"))
    record = tmp_path / "mgpu-runs" / run_id / "run.json"

    def status():
        try:
            return json.loads(record.read_text())["status"]
        except (OSError, ValueError):
            return None

    try:
        wait_for_both_tasks_hanging(proc, run_id)
        assert status() == "running"
        proc.kill()
        proc.wait(10)
        wait_for(lambda: status() == "launcher-died", 30, lambda: status())
        wait_for(lambda: not run_processes(run_id), 30)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


# The old launch's task: it ignores SIGTERM and stays until the test creates RELEASE. The remote
# hosts are this machine, where the new launcher's check for live processes of the run id would
# see it; a task on another machine is out of that check's sight, and so this one is made: it
# execs itself without mgpu's tags in its environment, keeping its pid, its group and its session.
OLD_TASK = r"""
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
env = {k: v for k, v in os.environ.items() if not k.startswith("MGPU_")}
os.execve(sys.executable, [sys.executable, "-c", '''
import os, pathlib, sys, time
print("old-up", os.getpgid(0), flush=True)
deadline = time.monotonic() + 120
while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
''', sys.argv[1]], env)
"""


NEW_TASK = r"""
import pathlib, sys, time
print("new-up", flush=True)
deadline = time.monotonic() + 120
while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
sys.exit(0 if pathlib.Path(sys.argv[1]).exists() else 3)
"""


def read_until(proc, text: bytes) -> bytes:
    """The first line of mgpu's stdout with `text` in it (at most 500 lines)."""
    for _ in range(500):
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()
        if text in line:
            return line
    raise AssertionError(f"no {text!r} in mgpu's output")


def guards_of(pgid: int) -> list[psutil.Process]:
    """The hang-up guards of the task whose group is `pgid`: its host's agent, its parent (with
    --no-host-agent, the shell guard of its session, in its group)."""
    found = []
    for p in proctree.every_process():
        try:
            if os.getpgid(p.pid) == pgid and "mgpu-guard" in p.cmdline():
                found.append(p)
            elif p.pid == psutil.Process(pgid).ppid() and "mgpu-host-agent" in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def test_a_run_id_used_again_after_its_launcher_was_killed_keeps_the_new_tasks(ssh_lab, tmp_path):
    """kill -9 of a launcher of an SSH run, then a new launch with the same run id: the old task's
    hang-up guard waits out its grace period for the old task (which ignores SIGTERM), then kills
    what carries its tags; the new launch's task, with the same run id, attempt, type and index,
    is not among them."""
    run_id = unique_run_id("reused")
    release, done = tmp_path / "release", tmp_path / "done"
    port_old, port_new = pick_free_ports(2)
    common = [*ssh_args(ssh_lab), "--run-id", run_id, "--no-check"]
    old = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port_old}", *common, "--log-dir", "old",
                         "--grace-period", "30", "--", PYTHON, "-c", OLD_TASK, str(release))
    new = None
    try:
        old_pgid = int(read_until(old, b"old-up").split()[-1])
        old_guards = guards_of(old_pgid)
        assert old_guards
        old.kill()
        old.wait(10)
        new = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port_new}", *common, "--log-dir", "new", "--",
                             PYTHON, "-c", NEW_TASK, str(done))
        read_until(new, b"new-up")
        release.touch()  # the old task goes; its guard ends (having killed what it found with its tags)
        wait_for(lambda: not [guard for guard in old_guards if guard.is_running()], 60, "the old guard to end")
        done.touch()
        new.wait(60)
        assert new.returncode == 0, new.stdout.read().decode() + new.stderr.read().decode()
    finally:
        release.touch()
        done.touch()
        for proc in (old, new):
            if proc is not None:
                proc.kill()
                proc.wait(10)
                proc.stdout.close()
                proc.stderr.close()


def test_tasks_on_different_hosts_start_together(ssh_lab, tmp_path):
    """Each start over SSH waits for the host's login shell; the hosts' starts overlap. Here the
    first host's shell (sshd's ForceCommand) waits until the second host's task has written a file:
    started one after another in plan order, the first task would find no file (its shell gives up
    waiting after 30 s, and only then would the second task start)."""
    started = tmp_path / "second-task-started"
    force = (f"i=0; while [ ! -e {started} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
             'eval "$SSH_ORIGINAL_COMMAND"')
    with forced_host(ssh_lab, tmp_path, "waits", force) as (known, config):
        program = ("import os, pathlib, sys; flag = pathlib.Path(sys.argv[1]); index = os.environ['MGPU_TASK_INDEX']\n"
                   "if index == '1': flag.touch()\n"
                   "print('task', index, 'sees the file' if flag.exists() else 'sees no file', flush=True)\n")
        port_a, port_b = pick_free_ports(2)
        proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"waits:{port_a},sshd-b:{port_b}", "--no-check",
                              "--ssh-config", str(config), "--known-hosts", str(known), "--connect-timeout", "5",
                              "--run-id", unique_run_id("together"), "--", PYTHON, "-c", program, str(started))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert "task 0 sees the file" in out.decode(), out.decode() + err.decode()


def test_the_checks_session_starts_the_hosts_first_task_as_a_session_of_its_own_would(ssh_lab, tmp_path):
    """The check's SSH session runs the host's first task, so each login runs the user's start-up
    files once (here sshd's ForceCommand counts the sessions, and leaves a line on stderr
    unfinished, as a chatty start-up file may). The task gets what a session of its own gives it
    (without the checks, the host's agent has one), in the login directory and in a --workdir, through
    the host's agent and with --no-host-agent."""
    sessions = tmp_path / "sessions"
    force = f'echo session >> {sessions}; printf "motd, no newline" >&2; eval "$SSH_ORIGINAL_COMMAND"'
    with forced_host(ssh_lab, tmp_path, "counted", force) as (known, config):
        for workdir in ([], ["--workdir", str(tmp_path)]):
            seen = {}
            # --no-host-agent's check session starts the task as the agent does: in the login folder only.
            for checks in ([], ["--no-check"]) + (() if workdir else (["--no-host-agent"],)):
                sessions.write_text("")
                (port,) = pick_free_ports(1)
                proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"counted:{port}", *checks, *workdir,
                                      "--ssh-config", str(config), "--known-hosts", str(known), "--connect-timeout",
                                      "5", "--run-id", unique_run_id("held"), "--", *SESSION_COMMAND)
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err.decode()
                assert sessions.read_text().count("session") == 1, (checks, sessions.read_text(), err.decode())
                line = next(line for line in out.decode().splitlines() if "SESSION " in line)
                seen[" ".join(checks)] = json.loads(line.split("SESSION ", 1)[1])
            held, own, no_agent = seen[""], seen["--no-check"], seen.get("--no-host-agent", seen[""])
            assert held["env"]["MGPU_TASK_TYPE"] == "worker" and "TF_CPP_MIN_LOG_LEVEL" not in held["env"]
            for name in _PER_LAUNCH:
                held["env"].pop(name, None), own["env"].pop(name, None), no_agent["env"].pop(name, None)
            assert held == own == no_agent
            assert held["cwd"] == (workdir[1] if workdir else os.path.expanduser("~" + ssh_lab.user))
            ignored = int(held["signals"].split("SigIgn:")[1].split()[0], 16)
            assert held["leader"] and not ignored & (1 << signal.SIGPIPE - 1 | 1 << signal.SIGXFSZ - 1)
