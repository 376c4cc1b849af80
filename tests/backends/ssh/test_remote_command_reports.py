"""A remote session's reports: its process-group line, the join reporter, and the channel stream that takes them out."""

from __future__ import annotations

import os
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
from launching import free_port
from remote_sessions import SLEEPER, read_pgid, start_like_sshd


def test_pgid_line_parsing():
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID 123\n") == (b"", 123)
    assert remote_command.split_pgid_line(b"Welcome to host\n") == (b"Welcome to host\n", None)
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID abc\n") == (b"MGPU_REMOTE_PGID abc\n", None)
    assert remote_command.split_pgid_line(b"  MGPU_REMOTE_PGID 123\n") == (b"  ", 123)


def test_a_login_shells_unfinished_line_before_the_pgid_line_stays_in_the_stream():
    assert remote_command.split_pgid_line(b"Welcome (no newline)MGPU_REMOTE_PGID 42\n") == (b"Welcome (no newline)", 42)
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID 42\n") == (b"", 42)
    assert remote_command.split_pgid_line(b"MGPU_REMOTE_PGID 42 and more\n") == (b"MGPU_REMOTE_PGID 42 and more\n", None)


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
