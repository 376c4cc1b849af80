"""SshBackend against real OpenSSH servers on loopback ports."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import psutil
import pytest

from launcher.errors import ConnectError, HostKeyError
from launcher.host import proctree
from launcher.plan.coordinator import Coordinator
from launcher.plan.planner import TaskPlan
from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings

from launching import free_port, wait_for
from ssh_helpers import ECHO_PROGRAM, PYTHON, TRICKY, require_tools, run_processes, start_sshd, unique_run_id

pytestmark = pytest.mark.ssh


def plan(host: str, argv, env=None, ssh: SshSettings = SshSettings(), run_id: str | None = None, workdir=None,
         index: int = 0) -> TaskPlan:
    run_id = run_id or unique_run_id("ssh-test")
    full_env = {"TF_CONFIG": "{}", "MGPU_RUN_ID": run_id, "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": str(index)}
    full_env.update(env or {})
    return TaskPlan("worker", index, host, 2222, False, ssh, tuple(argv), full_env, workdir, False)


def drain(proc) -> tuple[bytes, bytes]:
    """Read both streams concurrently, as the supervisor does."""
    chunks = {"out": [], "err": []}

    def pump(stream, key):
        while True:
            line = stream.readline()
            if not line:
                return
            chunks[key].append(line)

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out")),
               threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "stream did not end"
    return b"".join(chunks["out"]), b"".join(chunks["err"])


def read_stderr_beside(proc) -> threading.Thread:
    """Read the task's stderr to its end in the background, as the supervisor does: the join
    reporter's reports come in it. The thread ends with the stream (the reporter gone too)."""
    reader = threading.Thread(target=lambda: [None for _ in iter(proc.stderr.readline, b"")], daemon=True)
    reader.start()
    return reader


def wait_exit(proc, timeout: float = 120) -> int:
    wait_for(lambda: proc.poll() is not None, timeout, "the task's end", interval=0.02)
    return proc.poll()


@pytest.fixture
def runner(ssh_lab):
    r = SshBackend(ssh_lab.options(), grace_period=2)
    yield r
    r.close()


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


# -- host keys -------------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_its_fingerprint(ssh_lab, tmp_path):
    unknown_key_id = unique_run_id("unknown-key")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    runner = SshBackend(ssh_lab.options(known_hosts=str(empty)), grace_period=2)
    with pytest.raises(HostKeyError) as info:
        runner.start(plan("sshd-a", [PYTHON, "-c", "print(1)"], run_id=unknown_key_id), attempt=0)
    runner.close()
    message = str(info.value)
    assert f"[127.0.0.1]:{ssh_lab.a.port}" in message
    assert ssh_lab.a.fingerprint() in message and message.count("\n") == 0
    assert "--accept-new-host-keys" in message and "ssh-keyscan" in message
    assert empty.read_text() == ""
    assert not run_processes(unknown_key_id)


def test_accept_new_records_the_key_then_trusts_it(ssh_lab, tmp_path, isolated_home):
    known = tmp_path / "known_hosts"
    runner = SshBackend(ssh_lab.options(known_hosts=str(known), accept_new_host_keys=True), grace_period=2)
    assert runner.run(plan("sshd-a", ["true"]), "exit 0", 10)[0] == 0
    runner.close()
    assert known.read_text() == ssh_lab.a.known_hosts_line()
    # Recorded keys are trusted without the flag; OpenSSH's own ssh-keygen can find the entry.
    runner = SshBackend(ssh_lab.options(known_hosts=str(known)), grace_period=2)
    assert runner.run(plan("sshd-a", ["true"]), "exit 0", 10)[0] == 0
    runner.close()
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{ssh_lab.a.port}", "-f", str(known)],
                           capture_output=True, text=True)
    assert found.returncode == 0
    # Without --known-hosts, the key goes to ~/.ssh/known_hosts.
    runner = SshBackend(ssh_lab.options(known_hosts=None, accept_new_host_keys=True), grace_period=2)
    assert runner.run(plan("sshd-b", ["true"]), "exit 0", 10)[0] == 0
    runner.close()
    assert (isolated_home / ".ssh" / "known_hosts").read_text() == ssh_lab.b.known_hosts_line()


def test_changed_host_key_is_always_refused(ssh_lab, tmp_path):
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{ssh_lab.a.port} ssh-ed25519 {ssh_lab.b.public_key}\n")
    for accept_new in (False, True):
        runner = SshBackend(ssh_lab.options(known_hosts=str(wrong), accept_new_host_keys=accept_new), grace_period=2)
        with pytest.raises(HostKeyError, match="CHANGED") as info:
            runner.run(plan("sshd-a", ["true"]), "exit 0", 10)
        runner.close()
        assert ssh_lab.a.fingerprint() in str(info.value) and "ssh-keygen -R" in str(info.value)
    assert wrong.read_text().count("\n") == 1


# -- logging in and ssh config ---------------------------------------------------------------


def test_wrong_client_key_is_refused(ssh_lab):
    wrong_key_id = unique_run_id("wrong-key")
    runner = SshBackend(ssh_lab.options(), grace_period=2)
    # The spec's identity wins over the ssh config's IdentityFile.
    wrong = plan("sshd-a", ["true"], ssh=SshSettings(identity_file=str(ssh_lab.wrong_key)), run_id=wrong_key_id)
    with pytest.raises(ConnectError, match="authentication failed") as info:
        runner.start(wrong, attempt=0)
    runner.close()
    assert "sshd-a" in str(info.value) and not isinstance(info.value, HostKeyError)
    assert not run_processes(wrong_key_id)


def test_ssh_log_is_silenced_for_mgpus_connections_only(ssh_lab):
    """A failed login logs nothing through mgpu's connection, while paramiko's own logger,
    which a program importing mgpu may use for its connections, keeps its settings."""
    import logging

    paramiko_log = logging.getLogger("paramiko")
    before = (paramiko_log.propagate, list(paramiko_log.handlers), paramiko_log.level)
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    collect = Collect(level=logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(collect)
    old_level, root.level = root.level, logging.DEBUG
    try:
        runner = SshBackend(ssh_lab.options(), grace_period=2)
        wrong = plan("sshd-a", ["true"], ssh=SshSettings(identity_file=str(ssh_lab.wrong_key)))
        with pytest.raises(ConnectError, match="authentication failed"):
            runner.start(wrong, attempt=0)
        runner.close()
        logging.getLogger("paramiko.transport").info("a program's own paramiko record")
    finally:
        root.removeHandler(collect)
        root.level = old_level
    assert (paramiko_log.propagate, list(paramiko_log.handlers), paramiko_log.level) == before
    assert [r.getMessage() for r in records if r.name.startswith("paramiko")] == ["a program's own paramiko record"]
    assert not [r for r in records if r.name.startswith("mgpu")]


def test_unreachable_host_is_one_clear_error(ssh_lab):
    port = free_port()
    runner = SshBackend(ssh_lab.options(connect_timeout=3), grace_period=2)
    with pytest.raises(ConnectError, match="refused") as info:
        runner.run(plan("127.0.0.1", ["true"], ssh=SshSettings(port=port)), "exit 0", 5)
    runner.close()
    assert f"127.0.0.1]:{port}" in str(info.value)


def test_default_ssh_config_and_precedence(ssh_lab, isolated_home):
    ssh_dir = isolated_home / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "config").write_text(ssh_lab.ssh_config.read_text())
    (ssh_dir / "known_hosts").write_text(ssh_lab.known_hosts.read_text())
    runner = SshBackend(ssh_lab.options(known_hosts=None, ssh_config=None), grace_period=2)
    program = "import os; print(os.environ['SSH_CONNECTION'].split()[3])"
    try:
        # HostName, Port, User and IdentityFile come from ~/.ssh/config ...
        proc = runner.start(plan("sshd-a", [PYTHON, "-c", program]), attempt=0)
        assert int(drain(proc)[0]) == ssh_lab.a.port
        proc.close()
        # ... and a port in the spec wins over the config's.
        proc = runner.start(plan("sshd-a", [PYTHON, "-c", program], ssh=SshSettings(port=ssh_lab.b.port)), attempt=0)
        assert int(drain(proc)[0]) == ssh_lab.b.port
        proc.close()
    finally:
        runner.close()


def test_missing_ssh_config_file_is_an_error(ssh_lab, tmp_path):
    with pytest.raises(ConnectError, match="ssh config file not found"):
        SshBackend(ssh_lab.options(ssh_config=str(tmp_path / "nope")), grace_period=2)


def test_proxy_jump_through_a_second_sshd(ssh_lab, tmp_path):
    jump = start_sshd(tmp_path, "jump", ssh_lab.authorized_keys, log_level="DEBUG")
    try:
        known = tmp_path / "known_hosts"
        known.write_text(ssh_lab.known_hosts.read_text() + jump.known_hosts_line())
        config = tmp_path / "ssh_config"
        config.write_text(
            ssh_lab.ssh_config.read_text()
            + f"Host jumphost\n  HostName 127.0.0.1\n  Port {jump.port}\n  IdentityFile {ssh_lab.client_key}\n"
            + f"Host behind\n  HostName 127.0.0.1\n  Port {ssh_lab.b.port}\n  IdentityFile {ssh_lab.client_key}\n"
            + "  ProxyJump jumphost\n"
        )
        runner = SshBackend(ssh_lab.options(known_hosts=str(known), ssh_config=str(config)), grace_period=2)
        try:
            proc = runner.start(plan("behind", [PYTHON, "-c", "print('through')"]), attempt=0)
            assert drain(proc)[0] == b"through\n"
            proc.close()
        finally:
            runner.close()
        # The jump server opened the forwarded connection to the target.
        log = jump.log.read_text(errors="replace")
        assert "direct-tcpip" in log and f"port {ssh_lab.b.port}" in log
    finally:
        jump.stop()


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


def test_proxy_jump_values_are_parsed_like_host_entries():
    import paramiko

    from launcher.errors import UsageError
    from launcher.config.addresses import Endpoint
    from launcher.backends.ssh.target import resolve_target

    target = resolve_target("gpu", SshSettings(proxy_jump="alice@[::1]:2200, bastion"), paramiko.SSHConfig())
    assert target.proxy_jump == (Endpoint("::1", 2200, "alice"), Endpoint("bastion"))
    for bad in ("bastion:notaport", "a,b:0", "[::1"):
        with pytest.raises(UsageError, match=r"^gpu: bad ProxyJump ") as info:
            resolve_target("gpu", SshSettings(proxy_jump=bad), paramiko.SSHConfig())
        assert bad.split(",")[-1] in str(info.value)


def test_login_through_ssh_agent(ssh_lab, tmp_path, monkeypatch):
    """No IdentityFile anywhere and no keys in ~/.ssh: the key comes from a real ssh-agent."""
    require_tools("ssh-agent", "ssh-add")
    sock_dir = tempfile.mkdtemp(prefix="mgpu-agent-")  # short: a socket path has at most 107 bytes
    sock = os.path.join(sock_dir, "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.path.exists(sock), 10)
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        # Reached by address, so the ssh config's IdentityFile for sshd-a does not apply.
        task = plan("127.0.0.1", ["true"], ssh=SshSettings(port=ssh_lab.a.port))
        runner = SshBackend(ssh_lab.options(), grace_period=2)
        try:
            with pytest.raises(ConnectError, match="authentication failed"):
                runner.run(task, "exit 0", 10)  # the agent holds no key yet
        finally:
            runner.close()
        subprocess.run(["ssh-add", "-q", str(ssh_lab.client_key)], check=True, env={**os.environ, "SSH_AUTH_SOCK": sock},
                       stdin=subprocess.DEVNULL, capture_output=True)
        runner = SshBackend(ssh_lab.options(), grace_period=2)
        try:
            code, out, _ = runner.run(task, "echo $SSH_CONNECTION", 10)
        finally:
            runner.close()
        assert code == 0 and out.split()[3] == str(ssh_lab.a.port).encode()
    finally:
        agent.terminate()
        agent.wait(10)
        shutil.rmtree(sock_dir, ignore_errors=True)


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


# -- the task's output, and whether it has joined its cluster -------------------------------


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


def kept_shells(folder) -> list[psutil.Process]:
    """The shells of sessions that host checks kept to start a task (their script names `folder`,
    the task's workdir)."""
    from launcher.backends.ssh.handover import HANDOVER

    found = []
    for proc in proctree.every_process():
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if HANDOVER in cmdline and str(folder) in cmdline:
            found.append(proc)
    return found


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
    from test_launch_over_ssh import forced_host

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
