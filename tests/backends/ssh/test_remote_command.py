"""The remote wrapper, run by a real /bin/sh in a new session, the way sshd runs it."""

from __future__ import annotations

import json
import os
import pathlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from launcher.backends.ssh import remote_command
from launcher.host import proctree
from launching import free_port
from ssh_helpers import ECHO_PROGRAM, TRICKY

def start_like_sshd(remote: remote_command.RemoteTask) -> subprocess.Popen:
    """Run a command line as sshd does for a session without a pty (own session, pipes), and send
    the env on its stdin as the SSH runner does."""
    proc = subprocess.Popen(["/bin/sh", "-c", remote.command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    proc.stdin.write(remote.stdin)
    proc.stdin.flush()
    return proc


def finish(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    """Wait for the task with its stdin still open (closing it ends the session, which kills the task)."""
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(30)
    proc.stdin.close()
    return out, err


def read_pgid(proc: subprocess.Popen) -> int:
    line = proc.stderr.readline()
    _, pgid = remote_command.split_pgid_line(line)
    assert pgid is not None, line
    return pgid


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


def test_pgid_line_parsing():
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID 123\n") == (b"", 123)
    assert remote_command.split_pgid_line(b"Welcome to host\n") == (b"Welcome to host\n", None)
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID abc\n") == (b"MGPU_REMOTE_PGID abc\n", None)
    assert remote_command.split_pgid_line(b"  MGPU_REMOTE_PGID 123\n") == (b"  ", 123)


def test_a_login_shells_unfinished_line_before_the_pgid_line_stays_in_the_stream():
    assert remote_command.split_pgid_line(b"Welcome (no newline)MGPU_REMOTE_PGID 42\n") == (b"Welcome (no newline)", 42)
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID 42\n") == (b"", 42)
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID 42 and more\n") == (b"MGPU_REMOTE_PGID 42 and more\n", None)


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


def test_a_channel_stream_hands_out_every_byte_it_receives():
    from launcher.backends.ssh.stream import ChannelStream

    # What looks like a marker of the wrapper's, split over reads behind a partial line, is the task's own text.
    chunks = [b"MGPU_REMOTE_PGID 7\nloading", b" data MGPU_REMOTE_LIS", b"TENING\ndone\n", b""]
    stream = ChannelStream(lambda size: chunks.pop(0))
    assert stream.readline() == b"MGPU_REMOTE_PGID 7\n"
    data = b""
    while chunk := stream.read1(65536):
        data += chunk
    assert data == b"loading data MGPU_REMOTE_LISTENING\ndone\n"


def test_a_channel_stream_takes_out_framed_reports_wherever_they_land():
    """Reports inside a line of the task's, split over reads, and a marker's first bytes at the end
    of one read: the reports go to their handler, the task's bytes stay as they were, and what only
    looked like the start of a report is the task's at the end of the stream."""
    from launcher.backends.ssh.stream import ChannelStream

    marker = remote_command.report_marker("0123abcd")
    chunks = [b"load", b"ing " + marker[:5], marker[5:] + b"usage 1 2 3\n data", b" " + marker + b"listening\n" + marker[:9],
              marker[9:] + b"connected\ndone\n\x1emgpu-0123abc", b""]
    reports = []
    stream = ChannelStream(lambda size: chunks.pop(0))
    stream.take_reports(marker, reports.append)
    data = b""
    while chunk := stream.read1(65536):
        data += chunk
    assert data == b"loading  data done\n\x1emgpu-0123abc"
    assert reports == [b"usage 1 2 3", b"listening", b"connected"]


def test_a_channel_stream_takes_out_the_reports_that_came_with_the_line_read_before():
    """The backend reads the wrapper's process-group line, then takes the reports out: on a busy
    launcher machine, the chunk with that line also brings the task's first output and a report,
    and a report may be cut after a marker's first bytes."""
    from launcher.backends.ssh.stream import ChannelStream

    marker = remote_command.report_marker("0123abcd")
    chunks = [b"MGPU_REMOTE_PGID 7\ntask line\n" + marker + b"usage 1 2 3\nmore " + marker[:4],
              marker[4:] + b"listening\n", b""]
    reports = []
    stream = ChannelStream(lambda size: chunks.pop(0))
    assert stream.readline() == b"MGPU_REMOTE_PGID 7\n"
    stream.take_reports(marker, reports.append)
    data = b""
    while chunk := stream.read1(65536):
        data += chunk
    assert data == b"task line\nmore "
    assert reports == [b"usage 1 2 3", b"listening"]


# -- the join reporter -------------------------------------------------------------------------


NONCE = "0123abcd"
MARKER = remote_command.report_marker(NONCE)


def start_join_reporter(session_id: int, own_port, coordinator_port) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", "-c", remote_command.join_report_command(session_id, own_port, coordinator_port,
                                                                                 NONCE)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def report(line: bytes) -> bytes:
    """A line of the reporter's, less its marker (which every line of it has)."""
    assert line.startswith(MARKER), line
    return line[len(MARKER):]


def listening_server(host: str = "127.0.0.2") -> socket.socket:
    server = socket.socket()
    server.bind((host, 0))
    server.listen(8)
    return server


# Listens on argv[1] (0: not at all) and connects to argv[2] (0: nowhere); beside that, always
# listens on another port and connects to the server at argv[3]: sockets of the session that the
# reporter must not take for joining. Then says so and waits.
JOINER = (
    "import socket, sys, time\n"
    "own, coordinator, other = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])\n"
    "keep = []\n"
    "s = socket.socket(); s.bind(('127.0.0.3', 0)); s.listen(); keep.append(s)\n"
    "keep.append(socket.create_connection(('127.0.0.2', other)))\n"
    "if own:\n"
    "    s = socket.socket(); s.bind(('127.0.0.3', own)); s.listen(); keep.append(s)\n"
    "if coordinator:\n"
    "    keep.append(socket.create_connection(('127.0.0.2', coordinator)))\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def wait_for_scans(reporter: subprocess.Popen, count: int, timeout: float = 30) -> None:
    """Until the reporter has looked at the sockets `count` more times. Each round of its loop
    reads /proc, reports, and only then sleeps: every new `sleep` child it starts ends a scan."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < count:
        assert reporter.poll() is None, "the reporter ended: " + repr(reporter.communicate())
        assert time.monotonic() < deadline, f"the reporter scanned {len(seen)} times in {timeout} s, not {count}"
        try:
            seen.update(p.pid for p in psutil.Process(reporter.pid).children() if p.name() == "sleep")
        except psutil.Error:
            pass
        time.sleep(0.01)


def unread(stream) -> bytes:
    """What a pipe holds now, without waiting for more."""
    chunks = []
    while select.select([stream], [], [], 0)[0]:
        chunk = os.read(stream.fileno(), 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def join_reports(out: bytes) -> list[bytes]:
    """The reporter's lines about joining, without its usage samples."""
    return [report(line) for line in out.splitlines(keepends=True) if not report(line).startswith(b"usage ")]


def next_join_report(stream) -> bytes:
    while (line := report(stream.readline())).startswith(b"usage "):
        pass
    return line


@pytest.mark.parametrize("listens,connects,reports", [
    (True, False, [b"listening\n"]),
    (False, True, [b"connected\n"]),
    (True, True, [b"listening\n", b"connected\n"]),
    (False, False, []),
], ids=["listens", "connects", "both", "neither"])
def test_the_join_reporter_reports_what_the_session_does_and_exits_with_it(listens, connects, reports):
    coordinator = listening_server()  # "process 0", outside the task's session
    other = listening_server()  # a server the task also talks to
    own = free_port("127.0.0.3")
    argv = [sys.executable, "-c", JOINER, str(own if listens else 0),
            str(coordinator.getsockname()[1] if connects else 0), str(other.getsockname()[1])]
    proc = start_like_sshd(remote_command.task_command(argv, {}, None, 1))
    reporter = None
    try:
        pgid = read_pgid(proc)
        assert proc.stdout.readline() == b"up\n"
        reporter = start_join_reporter(pgid, own, coordinator.getsockname()[1])
        got = sorted(next_join_report(reporter.stdout) for _ in reports)
        assert got == sorted(reports)
        # Two more rounds with the task's sockets unchanged: nothing more to say about joining.
        wait_for_scans(reporter, 2, timeout=60)
        assert join_reports(unread(reporter.stdout)) == []
        proc.kill()  # the task ends: so does its reporter
        proc.wait(10)
        out, err = reporter.communicate(timeout=10)
        assert (join_reports(out), err, reporter.returncode) == ([], b"", 0)
    finally:
        stop_task_and_reporter(proc, reporter)
        coordinator.close()
        other.close()


def test_the_join_reporter_ignores_other_sessions_sockets():
    """The coordinator's own listening socket and a connection from outside the session are not the task's."""
    coordinator = listening_server()
    outsider = socket.create_connection(coordinator.getsockname())
    other = listening_server()
    proc = start_like_sshd(remote_command.task_command(
        [sys.executable, "-c", JOINER, "0", "0", str(other.getsockname()[1])], {}, None, 1))
    reporter = None
    try:
        pgid = read_pgid(proc)
        assert proc.stdout.readline() == b"up\n"
        reporter = start_join_reporter(pgid, coordinator.getsockname()[1], coordinator.getsockname()[1])
        wait_for_scans(reporter, 2)
        assert join_reports(unread(reporter.stdout)) == []
        proc.kill()
        proc.wait(10)
        out, err = reporter.communicate(timeout=10)
        assert (join_reports(out), err) == ([], b"")
    finally:
        stop_task_and_reporter(proc, reporter)
        outsider.close()
        other.close()
        coordinator.close()


# A child that computes until the file argv[1] exists, then sleeps beside its parent, which sleeps:
# the session's threads, summed over processes.
COMPUTE_THEN_SLEEP = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    while not os.path.exists(sys.argv[1]):\n"
    "        end = time.monotonic() + 0.01\n"
    "        while time.monotonic() < end: pass\n"
    "    time.sleep(600)\n"
    "print('up', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.parametrize("pgrep, interval_cs", [(True, remote_command.USAGE_INTERVAL_CS), (False, 100)],
                         ids=["pgrep", "without-pgrep"])
def test_the_join_reporter_samples_the_sessions_cpu_use(tmp_path, pgrep, interval_cs):
    """Usage lines every interval (five times that without pgrep, on a PATH of only the tools the
    loop needs, grep beside pgrep): runnable time grows with the wall clock while a child of the task computes (on a
    CPU or waiting for one), hardly at all once it sleeps. The child computes through the first
    interval and is told to stop at its end; a 2 s interval after that may still hold a moment of
    the computing, so with pgrep the one after it is the sleeping one. Without pgrep the test asks
    for 1 s instead of the product's 2 s: 5 s between samples."""
    every = interval_cs / 100 * (1 if pgrep else 5)
    intervals = 3 if pgrep else 2
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ["cat", "awk", "sleep", "ls", "printf"] + (["pgrep", "grep"] if pgrep else []):
        (tools / tool).symlink_to(shutil.which(tool))
    stop = tmp_path / "stop"
    proc = start_like_sshd(remote_command.task_command([sys.executable, "-c", COMPUTE_THEN_SLEEP, str(stop)], {}, None, 1))
    reporter = None
    try:
        pgid = read_pgid(proc)
        assert proc.stdout.readline() == b"up\n"
        reporter = subprocess.Popen(["/bin/sh", "-c", remote_command.join_report_command(pgid, None, None, NONCE,
                                                                                         interval_cs)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, env={"PATH": str(tools)})
        samples = []
        while len(samples) <= intervals:  # each readline is bounded: the reporter prints every `every` s
            usage = remote_command.parse_usage(report(reporter.stdout.readline()).decode().strip())
            assert usage is not None
            samples.append(usage)
            if len(samples) == 2:
                stop.touch()
        assert all(later[0] - earlier[0] >= every - 0.02 for earlier, later in zip(samples, samples[1:]))
        shares = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in zip(samples, samples[1:])]
        assert shares[0] > 0.8, samples  # computing: runnable all the time
        assert shares[-1] < 0.1, samples  # asleep
        assert samples[-1][1] > 0.1 and samples[-1][2] >= samples[-1][1]  # some of it on a CPU
    finally:
        stop_task_and_reporter(proc, reporter)


def next_state_report(reporter: subprocess.Popen, timeout: float = 30) -> bytes:
    """The reporter's next line that is not a usage sample (it samples every 0.2 s here, so each
    readline returns soon)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = report(reporter.stdout.readline())
        if not line.startswith(b"usage "):
            return line
    raise AssertionError(f"no state report in {timeout} s")


def test_the_join_reporter_says_when_a_process_of_the_task_is_stopped_and_continued():
    proc = start_like_sshd(remote_command.task_command([sys.executable, "-c", SLEEPER], {}, None, 1))
    reporter = None
    try:
        pgid = read_pgid(proc)
        task_pid = int(proc.stdout.readline())
        reporter = subprocess.Popen(["/bin/sh", "-c", remote_command.join_report_command(pgid, None, None, NONCE, 20)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        os.kill(task_pid, signal.SIGSTOP)
        assert next_state_report(reporter) == remote_command.STOPPED.encode() + b"\n"
        os.kill(task_pid, signal.SIGCONT)
        assert next_state_report(reporter) == remote_command.RUNNING.encode() + b"\n"
    finally:
        stop_task_and_reporter(proc, reporter)


def stop_task_and_reporter(proc: subprocess.Popen, reporter: subprocess.Popen | None) -> None:
    proc.stdin.close()
    proc.kill()
    proc.wait(10)
    if reporter is not None:
        reporter.kill()
        reporter.wait(10)


SLEEPER = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n"


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
