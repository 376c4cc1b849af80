"""The remote wrapper as sshd runs it: the task gets argv, env and folder byte-exact; the guard ends its processes."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from launcher.backends.ssh import remote_command
from launcher.host import proctree
from remote_sessions import SLEEPER, read_pgid, start_like_sshd
from ssh_helpers import ECHO_PROGRAM, TRICKY


def finish(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    """Wait for the task with its stdin still open (closing it ends the session, which kills the task)."""
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(30)
    proc.stdin.close()
    return out, err


def test_arguments_and_environment_arrive_byte_exact(tmp_path):
    env = {f"MGPU_T{i}": value for i, value in enumerate(TRICKY)}
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["h1:2222", "h'2:2222"]}, "task": {"type": "worker", "index": 0}})
    workdir = tmp_path / "work dir 'x'"
    workdir.mkdir()
    for name, value in env.items():
        argv = [sys.executable, "-c", ECHO_PROGRAM, name, *TRICKY]
        proc = start_like_sshd(remote_command.task_command(argv, env, str(workdir), grace_period=1))
        assert read_pgid(proc) == proc.pid
        out, err = finish(proc)
        assert proc.returncode == 0, err
        got = json.loads(out)
        assert got["argv"] == [name, *TRICKY]
        assert got["env"] == {name: value}
        assert got["cwd"] == str(workdir)
    assert not os.path.exists("/tmp/mgpu-should-not-exist")


def test_environment_names_are_validated():
    with pytest.raises(ValueError):
        remote_command.task_command(["true"], {"BAD NAME": "x"}, None, 1)


def test_exit_status_and_signal_pass_through():
    proc = start_like_sshd(remote_command.task_command([sys.executable, "-c", "import sys; sys.exit(7)"], {}, None, 1))
    read_pgid(proc)
    finish(proc)
    assert proc.returncode == 7
    proc = start_like_sshd(remote_command.task_command(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"], {}, None, 1))
    read_pgid(proc)
    finish(proc)
    assert proc.returncode == -signal.SIGUSR1  # the wrapper execs: no shell in between


def test_missing_workdir_fails_without_running(tmp_path):
    marker = tmp_path / "ran"
    proc = start_like_sshd(remote_command.task_command(["touch", str(marker)], {}, str(tmp_path / "nope"), 1))
    read_pgid(proc)
    _, err = finish(proc)
    assert proc.returncode != 0 and b"nope" in err
    assert not marker.exists()


TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)

STUBBORN_TREE = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for p in proctree.every_process():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p)
        except (psutil.Error, ProcessLookupError):
            continue
    return members


def wait_group_gone(pgid: int, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        left = group_members(pgid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.parametrize("program,grace,ended_by", [(TREE, 2, signal.SIGTERM), (STUBBORN_TREE, 1, signal.SIGKILL)],
                         ids=["terms", "ignores-term"])
def test_end_of_session_kills_the_whole_tree(program, grace, ended_by):
    """When sshd closes the session's stdin (connection gone), the guard kills the group: TERM
    first, KILL after the grace period."""
    proc = start_like_sshd(remote_command.task_command([sys.executable, "-c", program], {}, None, grace))
    pgid = read_pgid(proc)
    child = int(proc.stdout.readline())
    assert os.getpgid(child) == pgid
    started = time.monotonic()
    proc.stdin.close()  # what sshd does when the session ends
    assert wait_group_gone(pgid, grace + 10) == []
    assert proc.wait(5) == -ended_by
    assert time.monotonic() - started < grace + 10


def test_signal_command_reaches_the_group():
    proc = start_like_sshd(remote_command.task_command([sys.executable, "-c", TREE], {}, None, 5))
    pgid = read_pgid(proc)
    int(proc.stdout.readline())
    subprocess.run(["/bin/sh", "-c", remote_command.signal_command([pgid], signal.SIGTERM)], check=True)
    assert proc.wait(10) == -signal.SIGTERM
    # The guard ignores TERM and leaves once its stdin closes.
    proc.stdin.close()
    assert wait_group_gone(pgid, 10) == []
    # Signalling a group that is gone is quiet and succeeds.
    result = subprocess.run(["/bin/sh", "-c", remote_command.signal_command([pgid], signal.SIGKILL)],
                            capture_output=True)
    assert result.returncode == 0 and result.stderr == b""


def test_a_stack_request_leaves_no_core_file(tmp_path):
    """The SIGABRT that asks a stalled remote task for its stacks, with `ulimit -c unlimited` on the
    host: the group's core limits are lowered to 0 first. A child shell reads its own limit as the
    signal arrives; it, its `sleep` and the task would each leave a core file in the task's folder."""
    program = str(pathlib.Path(__file__).parents[2] / "programs" / "core_limit_task.py")
    work = tmp_path / "work"
    work.mkdir()
    proc = start_like_sshd(remote_command.task_command([sys.executable, program], {}, str(work), 5))
    try:
        pgid = read_pgid(proc)
        deadline = time.monotonic() + 60
        while not (work / "child-ready-0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["/bin/sh", "-c", remote_command.signal_command([pgid], signal.SIGABRT)], check=True)
        assert proc.wait(30) == -signal.SIGABRT
        deadline = time.monotonic() + 30
        while not (work / "limits-0.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (work / "limits-0.txt").read_text().split()[4] == "0"  # Max core file size <soft> <hard> bytes
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait(10)
    assert wait_group_gone(pgid, 10) == []
    assert not [p.name for p in work.iterdir() if p.name.startswith("core")]


def test_one_signal_command_reaches_several_groups_even_if_one_is_gone():
    procs = [start_like_sshd(remote_command.task_command([sys.executable, "-c", TREE], {}, None, 5)) for _ in range(2)]
    try:
        pgids = [read_pgid(proc) for proc in procs]
        for proc in procs:
            int(proc.stdout.readline())
        gone = 2**22 + 1  # above the largest pid_max Linux allows: a group that cannot exist
        subprocess.run(["/bin/sh", "-c", remote_command.signal_command([pgids[0], gone, pgids[1]], signal.SIGTERM)],
                       check=True)
        assert [proc.wait(10) for proc in procs] == [-signal.SIGTERM, -signal.SIGTERM]
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.kill()
            proc.wait(10)
    assert all(wait_group_gone(pgid, 10) == [] for pgid in pgids)


def tags(run_id: str, launch_id: str = "0123456789abcdef") -> dict[str, str]:
    return {"MGPU_LAUNCH_ID": launch_id, "MGPU_RUN_ID": run_id, "MGPU_ATTEMPT": "0", "MGPU_TASK_TYPE": "worker",
            "MGPU_TASK_INDEX": "0"}


def test_env_values_never_reach_a_command_line_another_user_can_read():
    secret = "s3cret-" + os.urandom(8).hex()
    remote = remote_command.task_command(
        [sys.executable, "-c", "import os, time; print(os.environ['TOKEN'], flush=True); time.sleep(60)"],
        {"TOKEN": secret, "MULTI": "a\nb'c"}, None, 1)
    assert secret not in remote.command
    proc = start_like_sshd(remote)
    try:
        pgid = read_pgid(proc)
        assert proc.stdout.readline().decode().strip() == secret  # the task runs, with its env
        # -ww: full command lines, whatever COLUMNS says (ps cuts them to COLUMNS even into a pipe).
        command = ["ps", "-ww", "-eo", "pid=,args="]
        if os.geteuid() == 0 and shutil.which("setpriv"):  # what another user of the host sees
            command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
        listing = subprocess.run(command, capture_output=True, check=True).stdout.decode("utf-8", "replace")
        rows = dict(line.strip().partition(" ")[::2] for line in listing.splitlines())
        assert "os.environ['TOKEN']" in rows[str(pgid)]  # the task's own command line is in the listing, whole
        assert secret not in listing
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait(10)


def test_values_with_newlines_and_quotes_arrive_byte_exact_through_stdin():
    env = {"A": "line1\nline2\n", "B": "it's \"$(x)\" `y`", "C": "", "D": "\n", "E": "é" * 5}
    proc = start_like_sshd(remote_command.task_command(
        [sys.executable, "-c", "import json, os; print(json.dumps({k: os.environ[k] for k in 'ABCDE'}))"],
        env, None, 1))
    read_pgid(proc)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert json.loads(out) == env


def test_a_session_that_ends_before_the_env_arrives_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    remote = remote_command.task_command(["touch", str(marker)], {"A": "1"}, None, 1)
    proc = subprocess.Popen(["/bin/sh", "-c", remote.command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    proc.stdin.write(remote.stdin[:3])
    proc.stdin.close()
    assert proc.wait(10) == 255
    assert not marker.exists()


ESCAPEE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


# The same, with a child that ignores SIGTERM (only the guard's final SIGKILL ends it); the child
# prints its pid once it does.
STUBBORN_ESCAPEE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(os.getpid(), flush=True); time.sleep(120)'], start_new_session=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.parametrize("program", [ESCAPEE, STUBBORN_ESCAPEE], ids=["terms", "ignores-term"])
def test_end_of_session_also_kills_tagged_processes_that_left_the_group(program):
    run_id = "escapee-" + os.urandom(4).hex()
    proc = start_like_sshd(remote_command.task_command([sys.executable, "-c", program], tags(run_id), None, 2))
    pgid = read_pgid(proc)
    child = psutil.Process(int(proc.stdout.readline()))
    try:
        assert os.getpgid(child.pid) != pgid  # setsid: out of the group's reach
        proc.stdin.close()
        child.wait(15)  # raises TimeoutExpired if the guard missed it
    finally:
        if child.is_running():
            child.kill()
    assert wait_group_gone(pgid, 10) == []
    proc.wait(5)


def test_workdir_like_an_option_and_program_paths_with_equals_run_what_they_say(tmp_path):
    (tmp_path / "-P").mkdir()
    program = tmp_path / "-P" / "x=y"
    program.write_text("#!/bin/sh\npwd\n")
    program.chmod(0o755)
    proc = subprocess.Popen(["/bin/sh", "-c", remote_command.task_command(["./x=y"], {"A": "1"}, "-P", 1).command],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, cwd=tmp_path)
    proc.stdin.write(remote_command.env_block({"A": "1"}))
    proc.stdin.flush()
    read_pgid(proc)
    out, err = finish(proc)
    assert proc.returncode == 0, err
    assert out.decode().strip() == str(tmp_path / "-P")


def test_the_guard_of_a_gone_launch_spares_a_later_launch_with_the_same_run_id():
    """The old launch's task ignores SIGTERM, so its guard keeps looking for the task's tagged
    processes for the whole grace period, then kills them. The new launch's task carries the same
    run id, attempt, type and index; only the launch's id tells them apart."""
    run_id = "reused-" + os.urandom(4).hex()
    old = start_like_sshd(remote_command.task_command([sys.executable, "-c", STUBBORN_TREE],
                                                      tags(run_id, "a" * 16), None, 2))
    new = start_like_sshd(remote_command.task_command([sys.executable, "-c", SLEEPER], tags(run_id, "b" * 16), None, 2))
    old_pgid, new_pgid = read_pgid(old), read_pgid(new)
    try:
        old.stdout.readline()  # the old task's child is up
        new_task = psutil.Process(int(new.stdout.readline()))
        old.stdin.close()  # the old launcher's connection is gone
        assert wait_group_gone(old_pgid, 15) == []  # its guard has had its grace period, and killed
        assert new_task.is_running() and new_task.status() != psutil.STATUS_ZOMBIE
    finally:
        new.stdin.close()
        assert wait_group_gone(new_pgid, 15) == []
        old.wait(5)
        new.wait(5)
