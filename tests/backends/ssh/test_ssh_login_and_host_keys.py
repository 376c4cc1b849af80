"""SshBackend trusts only known host keys and logs in as the spec, the ssh config, a ProxyJump or an ssh-agent say."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launcher.errors import ConnectError, HostKeyError
from launching import free_port, wait_for
from ssh_helpers import PYTHON, require_tools, run_processes, start_sshd, unique_run_id
from ssh_tasks import drain, plan

pytestmark = pytest.mark.ssh


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
