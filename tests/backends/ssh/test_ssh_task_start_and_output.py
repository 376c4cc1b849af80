"""SshBackend starts a task as its plan says, in a session of its own or its host check's, and carries its output."""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import threading
import time

import psutil
import pytest

from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launcher.plan.coordinator import Coordinator
from launcher.plan.planner import TaskPlan
from launching import free_port, wait_for
from ssh_helpers import ECHO_PROGRAM, PYTHON, TRICKY, start_sshd, unique_run_id
from ssh_tasks import drain, kept_shells, plan, wait_exit

pytestmark = pytest.mark.ssh


def test_streams_exit_code_and_process_group(runner):
    program = ("import os, sys; print('out', os.getpid(), os.getpgid(0), os.getsid(0)); "
               "print('err line', file=sys.stderr); sys.exit(3)")
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", program]), attempt=0)
    out, err = drain(proc)
    assert wait_exit(proc) == 3
    proc.close()
    pid, pgid, sid = map(int, out.split()[1:])
    assert pid == pgid == sid == proc.pid  # its own session and group, as reported
    assert b"err line" in err and b"MGPU_REMOTE_PGID" not in err


def test_arguments_and_environment_arrive_byte_exact(runner):
    env = {f"MGPU_T{i}": value for i, value in enumerate(TRICKY)}
    for name in ("MGPU_T2", "MGPU_T3", "MGPU_T5", "MGPU_T7", "MGPU_ATTEMPT"):
        proc = runner.start(plan("sshd-a", [PYTHON, "-c", ECHO_PROGRAM, name, *TRICKY], env), attempt=4)
        out, err = drain(proc)
        assert wait_exit(proc) == 0, err
        proc.close()
        got = json.loads(out)
        assert got["argv"] == [name, *TRICKY]
        assert got["env"] == {name: env.get(name, "4")}


def test_only_the_plan_environment_is_sent(runner, monkeypatch):
    monkeypatch.setenv("MGPU_LOCAL_SECRET", "do-not-send")
    program = "import os, json; print(json.dumps(dict(os.environ)))"
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", program], {"EXTRA": "yes"}), attempt=0)
    out, _ = drain(proc)
    wait_exit(proc)
    proc.close()
    remote_env = json.loads(out)
    assert remote_env["EXTRA"] == "yes" and remote_env["MGPU_ATTEMPT"] == "0"
    assert "MGPU_LOCAL_SECRET" not in remote_env


def test_tasks_on_one_host_share_a_connection(runner):
    procs = [runner.start(plan("sshd-a", [PYTHON, "-c", "print(1)"], index=i), attempt=0) for i in range(3)]
    for proc in procs:
        drain(proc)
        wait_exit(proc)
        proc.close()
    assert len(runner._connections) == 1 and len(next(iter(runner._connections.values()))) == 1


def test_missing_program_fails_the_task_with_its_message(runner):
    proc = runner.start(plan("sshd-a", ["/nonexistent/python3", "-m", "launcher.trainer"]), attempt=0)
    _, err = drain(proc)
    assert wait_exit(proc) == 127
    assert b"/nonexistent/python3" in err
    proc.close()


# -- the session a host's check kept ---------------------------------------------------------


def test_the_session_kept_by_a_failed_check_ends_with_the_check(runner, tmp_path):
    """A launch's check keeps each host's session to start the host's first task; a host that fails
    its check (here its task's port is taken) starts none, and the shell its session kept waiting
    ends then, not with the run (a spare that failed its checks would otherwise hold one)."""
    from launcher.preflight.check import check_hosts_and_reach

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        task = dataclasses.replace(plan("sshd-a", [PYTHON, "-c", "pass"], workdir=str(tmp_path)),
                                   port=taken.getsockname()[1])
        reports, _, _ = check_hosts_and_reach([task], [task], runner, handover=True)
    assert not reports[0].ok and "in use" in reports[0].reason, reports[0].reason
    wait_for(lambda: not kept_shells(tmp_path), 30, "the kept session's end")


def test_a_task_whose_kept_session_has_ended_starts_in_a_session_of_its_own(runner, tmp_path):
    """The shell a host check kept to start the task is gone when the task starts (killed here):
    the task starts all the same, in a new session."""
    from launcher.preflight.check import check_hosts_and_reach, handovers_of

    task = dataclasses.replace(plan("sshd-a", [PYTHON, "-c", "print('started')"], workdir=str(tmp_path)),
                               port=free_port())
    reports, _, _ = check_hosts_and_reach([task], [task], runner, handover=True)
    assert reports[0].ok, reports[0].reason
    runner.take_handovers(handovers_of(reports))
    shells = kept_shells(tmp_path)
    assert len(shells) == 1
    shells[0].kill()
    psutil.wait_procs(shells, 10)
    proc = runner.start(task, attempt=0)
    out, _ = drain(proc)
    assert wait_exit(proc) == 0 and out == b"started\n"
    proc.close()


@pytest.mark.parametrize("host_agent", [True, False], ids=["agent", "no-host-agent"])
def test_the_check_returns_its_kept_session_and_the_task_starts_in_it_once_the_backend_is_given_it(
        ssh_lab, tmp_path, host_agent):
    """A launch with checks costs one login per host, counted by sshd's ForceCommand: the session of
    the host's checks starts its tasks once the backend is given it (take_handovers), all three of
    them through its agent; with --no-host-agent, the host's first task."""
    from launcher.preflight.check import check_hosts_and_reach, handovers_of
    from ssh_tasks import forced_host

    sessions = tmp_path / "sessions"
    sessions.write_text("")
    force = f'echo session >> {sessions}; eval "$SSH_ORIGINAL_COMMAND"'
    with forced_host(ssh_lab, tmp_path, "counted", force) as (known, config):
        backend = SshBackend(ssh_lab.options(known_hosts=str(known), ssh_config=str(config), host_agent=host_agent),
                             grace_period=2)
        try:
            run_id = unique_run_id("one-login")
            tasks = [dataclasses.replace(plan("counted", [PYTHON, "-c", "print('started')"], run_id=run_id, index=i,
                                              workdir=str(tmp_path)), port=free_port())
                     for i in range(3 if host_agent else 1)]
            reports, _, _ = check_hosts_and_reach(tasks, tasks, backend, handover=True)
            assert reports[0].ok, reports[0].reason
            backend.take_handovers(handovers_of(reports))
            for proc in [backend.start(task, attempt=0) for task in tasks]:
                out, _ = drain(proc)
                assert wait_exit(proc) == 0 and out == b"started\n"
                proc.close()
        finally:
            backend.close()
    assert sessions.read_text().count("session") == 1, sessions.read_text()


# -- the task's output, and whether it has joined its cluster -------------------------------


def test_large_output_on_both_streams_does_not_stall(runner):
    program = (
        "import sys\n"
        "line = b'x' * 1023 + b'\\n'\n"
        "for i in range(16 * 1024):\n"
        "    sys.stdout.buffer.write(line); sys.stderr.buffer.write(line)\n"
    )
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", program]), attempt=0)
    out, err = drain(proc)
    assert wait_exit(proc) == 0
    proc.close()
    assert len(out) == len(err) == 16 * 1024 * 1024


def test_output_without_newlines_is_read_in_bounded_pieces(runner):
    from launcher.supervise.output import CHUNK

    program = "import sys\nfor i in range(320):\n    sys.stdout.buffer.write(b'y' * 65536)\nprint('end')\n"
    proc = runner.start(plan("sshd-a", [PYTHON, "-c", program]), attempt=0)
    sizes, last = [], b""
    while True:
        piece = proc.stdout.readline(CHUNK)
        if not piece:
            break
        sizes.append(len(piece))
        last = piece
    assert wait_exit(proc) == 0
    proc.close()
    assert sum(sizes) == 320 * 65536 + 4 and max(sizes) == CHUNK and last.endswith(b"end\n")


def test_stderr_arrives_byte_exact_even_with_the_wrappers_marker_texts(runner):
    """The join reporter's reports share the task's stderr, framed with a marker of the launch's
    own: they are taken out wherever they land (the task writes a byte at a time for 5 s, through
    two or three usage reports), and the task's own look-alikes stay."""
    text = (b"abcMGPU_REMOTE_LISTENING\ndef\nMGPU_REMOTE_PGID 1\nlistening\nconnected\n"
            b"\x1emgpu-0123456789abcdef listening\n\x1emgpu-\x1e\nno newline")
    program = (f"import sys, time\nfor b in {text!r}:\n"
               f"    sys.stderr.buffer.write(bytes([b])); sys.stderr.flush(); time.sleep(5 / {len(text)})")
    with socket.socket() as server:  # so that a join reporter runs, with something to report
        server.bind(("127.0.0.2", 0))
        server.listen()
        proc = runner.start(cluster_plan("sshd-a", [PYTHON, "-c", program], server.getsockname()[1]), attempt=0)
        out, err = drain(proc)
        assert wait_exit(proc) == 0
        usage = proc.usage()
        proc.close()
    assert (out, err) == (b"", text)
    assert usage is not None and usage.runnable_seconds > 0  # reports came, and were taken out


def cluster_plan(host: str, argv, coordinator_port: int, own_port: int | None = None) -> TaskPlan:
    """worker:1 of a cluster whose worker:0, the coordinator, is at 127.0.0.2:coordinator_port."""
    own_port = own_port or free_port("127.0.0.3")
    cluster = {"worker": [f"127.0.0.2:{coordinator_port}", f"127.0.0.3:{own_port}"]}
    env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}),
           "MGPU_RUN_ID": unique_run_id("join"), "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": "1"}
    return TaskPlan("worker", 1, host, own_port, False, SshSettings(), tuple(argv), env, None, False,
                    coordinator=Coordinator("127.0.0.2", coordinator_port))


# Connects to the coordinator at 127.0.0.2:argv[1] as JAX's and PyTorch's processes other than 0
# do (or, with argv[1] = 0, connects nowhere), and never listens.
CLIENT = ("import socket, sys, time\n"
          "port = int(sys.argv[1])\n"
          "conn = socket.create_connection(('127.0.0.2', port)) if port else None\n"
          "print('up', flush=True); time.sleep(300)\n")


def read_stderr_beside(proc) -> threading.Thread:
    """Read the task's stderr to its end in the background, as the supervisor does: the join
    reporter's reports come in it. The thread ends with the stream (the reporter gone too)."""
    reader = threading.Thread(target=lambda: [None for _ in iter(proc.stderr.readline, b"")], daemon=True)
    reader.start()
    return reader


@pytest.mark.parametrize("connects", [True, False], ids=["connects", "neither"])
def test_a_task_that_connects_to_the_coordinator_has_joined(runner, connects):
    with socket.socket() as coordinator:  # "process 0"
        coordinator.bind(("127.0.0.2", 0))
        coordinator.listen()
        port = coordinator.getsockname()[1]
        task = cluster_plan("sshd-a", [PYTHON, "-c", CLIENT, str(port if connects else 0)], port)
        proc = runner.start(task, attempt=0)
        stderr = read_stderr_beside(proc)
        try:
            assert proc.stdout.readline() == b"up\n"
            if connects:
                wait_for(lambda: proc.joined(task.port, port), 60)
                assert proc.listens_on(task.port) is False  # it never listens: joined, but not by its port
            else:
                # The task runs and does neither: the join reporter, which exits when the task does, says nothing.
                wait_for(lambda: proc.usage() is not None, 60, "the reporter's first report")
                proc.signal_tree(signal.SIGTERM)
                assert wait_exit(proc) == -signal.SIGTERM
                stderr.join(30)
                assert not stderr.is_alive()  # the reporter has said all it will
                assert proc.joined(task.port, port) is False and proc.listens_on(task.port) is False
            assert proc.joined(task.port + 1, port) is None  # ports it was not started with: cannot tell
        finally:
            proc.signal_tree(signal.SIGKILL)
            wait_exit(proc)
            proc.close()


def test_a_task_that_listens_on_its_own_port_has_joined(runner):
    own = free_port("127.0.0.3")
    program = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.3', %d)); s.listen(); "
               "print('up', flush=True); time.sleep(300)" % own)
    task = cluster_plan("sshd-a", [PYTHON, "-c", program], free_port("127.0.0.2"), own)
    proc = runner.start(task, attempt=0)
    read_stderr_beside(proc)
    try:
        assert proc.stdout.readline() == b"up\n"
        wait_for(lambda: proc.joined(task.port, None), 60)
        assert proc.listens_on(task.port) is True
    finally:
        proc.signal_tree(signal.SIGKILL)
        wait_exit(proc)
        proc.close()


def test_a_login_shells_unfinished_line_before_the_wrapper_stays_and_the_task_starts(ssh_lab, tmp_path):
    """A host whose shell prints a line without a newline before running the command (here sshd's
    ForceCommand does): that text stays in stderr, and the task's own output follows it intact."""
    server = start_sshd(tmp_path, "chatty", ssh_lab.authorized_keys,
                        extra='ForceCommand printf "motd, no newline" >&2; eval "$SSH_ORIGINAL_COMMAND"\n')
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    runner = SshBackend(ssh_lab.options(known_hosts=str(known)), grace_period=2)
    try:
        settings = SshSettings(port=server.port, identity_file=str(ssh_lab.client_key))
        program = "import sys; sys.stderr.write('task line\\n')"
        proc = runner.start(plan("127.0.0.1", [PYTHON, "-c", program], ssh=settings), attempt=0)
        out, err = drain(proc)
        assert wait_exit(proc) == 0
        proc.close()
        assert (out, err) == (b"", b"motd, no newlinetask line\n")
    finally:
        runner.close()
        server.stop()


FLOOD = "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 16384)\n"  # 4 MiB, then exit 0


def blocked_writing(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return "pipe_write" in f.read()  # pipe_write, anon_pipe_write: the kernel's name for it
    except OSError:
        return False


def written(pid: int) -> int:
    """The bytes a process has written so far (its wchar): what left it, read here or in flight."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


@pytest.mark.parametrize("host_agent", [True, False], ids=["agent", "no-host-agent"])
def test_what_a_task_sends_waits_on_the_remote_host_until_it_is_read(ssh_lab, host_agent):
    """A task that writes faster than the launcher reads waits on its host, blocked writing, with
    at most 1 MiB of its 4 MiB gone out of it (all that the launcher may hold unread of it), through
    its host's agent and in a session of its own (--no-host-agent); once read, every byte arrives."""
    backend = SshBackend(ssh_lab.options(host_agent=host_agent), grace_period=2)
    try:
        proc = backend.start(plan("sshd-a", [PYTHON, "-c", FLOOD]), attempt=0)

        def held_back() -> bool:  # blocked writing, and nothing more leaves it
            if proc.poll() is not None or not blocked_writing(proc.pid):
                return proc.poll() is not None
            before = written(proc.pid)
            time.sleep(0.5)
            return blocked_writing(proc.pid) and written(proc.pid) == before
        wait_for(held_back, 60, "the remote writer held back", interval=0.05)
        assert proc.poll() is None, "the whole 4 MiB was taken in while nothing read it"
        assert written(proc.pid) <= 1024 * 1024
        out, _ = drain(proc)
        assert out == bytes(range(256)) * 16384
        assert wait_exit(proc) == 0
        proc.close()
    finally:
        backend.close()
