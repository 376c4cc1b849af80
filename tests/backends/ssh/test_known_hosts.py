"""known_hosts read as OpenSSH reads it, and ProxyCommand, against real sshd servers."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from launcher.errors import ConnectError, HostKeyError
from launcher.backends.ssh import known_hosts
from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launcher.plan.planner import TaskPlan

from ssh_helpers import PYTHON

pytestmark = pytest.mark.ssh


def task(host: str) -> TaskPlan:
    return TaskPlan("worker", 0, host, 2222, False, SshSettings(), ("true",), {}, None, False)


def logs_in(ssh_lab, host: str = "sshd-a", **options) -> bool:
    runner = SshBackend(ssh_lab.options(**options), grace_period=2)
    try:
        return runner.run(task(host), "exit 0", 10)[0] == 0
    finally:
        runner.close()


def test_markers_and_bad_lines_are_skipped_with_a_warning(ssh_lab, tmp_path, capsys):
    a = ssh_lab.a.known_hosts_line().split()
    lines = tmp_path / "known_hosts"
    lines.write_text(
        f"@cert-authority *.example.com ssh-ed25519 {ssh_lab.b.public_key}\n"
        f"@revoked * ssh-ed25519 {ssh_lab.b.public_key}\n"
        "this line is corrupt\n"
        f"{a[0]} ssh-ed25519 not-base64!!\n"
        "@weird-marker host ssh-ed25519 AAAA\n"
        "# a comment\n\n"
        + " ".join(a) + "\n"
    )
    assert logs_in(ssh_lab, known_hosts=str(lines))
    warnings = capsys.readouterr().err.splitlines()
    assert [w.split(": ", 3)[2] for w in warnings] == [f"{lines}:{n}" for n in (1, 3, 4, 5)]
    assert "@cert-authority (host certificates) is not supported; line skipped" in warnings[0]


def test_a_revoked_key_is_refused_even_where_another_line_trusts_it(ssh_lab, tmp_path):
    revoked = tmp_path / "known_hosts"
    revoked.write_text(ssh_lab.a.known_hosts_line() + f"@revoked * ssh-ed25519 {ssh_lab.a.public_key}\n")
    for accept_new in (False, True):
        with pytest.raises(HostKeyError, match="is marked @revoked in known_hosts; refusing to connect"):
            logs_in(ssh_lab, known_hosts=str(revoked), accept_new_host_keys=accept_new)


def test_a_stale_key_in_the_home_file_does_not_override_a_right_one_in_known_hosts(ssh_lab, isolated_home):
    ssh_dir = isolated_home / ".ssh"
    ssh_dir.mkdir()
    name = ssh_lab.a.known_hosts_line().split()[0]
    (ssh_dir / "known_hosts").write_text(f"{name} ssh-ed25519 {ssh_lab.b.public_key}\n")  # stale: b's key
    assert logs_in(ssh_lab)  # ssh_lab.known_hosts has a's right key
    # Either file may match: the right key in the home file and nothing in --known-hosts works too.
    (ssh_dir / "known_hosts").write_text(ssh_lab.a.known_hosts_line())
    empty = isolated_home / "empty"
    empty.write_text("")
    assert logs_in(ssh_lab, known_hosts=str(empty))


def test_hashed_and_wildcard_entries_match(ssh_lab, tmp_path):
    hashed = tmp_path / "hashed"
    hashed.write_text(ssh_lab.a.known_hosts_line())
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert hashed.read_text().startswith("|1|")
    assert logs_in(ssh_lab, known_hosts=str(hashed))
    wildcard = tmp_path / "wildcard"
    wildcard.write_text(f"[127.0.0.?]:*,!nothing ssh-ed25519 {ssh_lab.a.public_key}\n")
    assert logs_in(ssh_lab, known_hosts=str(wildcard))
    negated = tmp_path / "negated"
    negated.write_text(f"[127.0.0.?]:*,![127.0.0.1]:{ssh_lab.a.port} ssh-ed25519 {ssh_lab.a.public_key}\n")
    with pytest.raises(HostKeyError, match="unknown host key"):
        logs_in(ssh_lab, known_hosts=str(negated))


def test_patterns_are_openssh_patterns_not_shell_globs():
    assert known_hosts.matches("[10.0.0.1]:2222", "[10.0.0.1]:2222")
    assert not known_hosts.matches("[10.0.0.1]:2222", "1")
    assert known_hosts.matches("*.example.com,!bad.example.com", "ok.example.com")
    assert not known_hosts.matches("*.example.com,!bad.example.com", "bad.example.com")
    assert known_hosts.matches("Host-A", "host-a")


def test_accepted_keys_are_recorded_privately_whatever_the_umask(ssh_lab, tmp_path):
    recorded = tmp_path / "known_hosts"
    previous = os.umask(0)
    try:
        assert logs_in(ssh_lab, known_hosts=str(recorded), accept_new_host_keys=True)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(recorded.stat().st_mode) == 0o600
    assert recorded.read_text() == ssh_lab.a.known_hosts_line()


RELAY = """
import os, socket, sys, threading
open(sys.argv[3], "a").write(f"{sys.argv[1]}:{sys.argv[2]}\\n")
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while data := os.read(0, 65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
"""


def test_proxy_command_is_honoured(ssh_lab, tmp_path):
    relay, used = tmp_path / "relay.py", tmp_path / "used"
    relay.write_text(RELAY)
    config = tmp_path / "ssh_config"
    config.write_text(ssh_lab.ssh_config.read_text().replace(
        "Host sshd-a\n", f"Host sshd-a\n  ProxyCommand {PYTHON} {relay} %h %p {used}\n"))
    assert logs_in(ssh_lab, ssh_config=str(config))
    assert used.read_text() == f"127.0.0.1:{ssh_lab.a.port}\n"


@pytest.mark.parametrize("where", ["--known-hosts", "~/.ssh/known_hosts"])
def test_a_new_key_is_never_recorded_through_a_symbolic_link(ssh_lab, tmp_path, isolated_home, where):
    target = tmp_path / "elsewhere"
    target.write_text("# not a known_hosts file\n")
    if where == "--known-hosts":
        link = tmp_path / "known_hosts"
    else:
        (isolated_home / ".ssh").mkdir(mode=0o700)
        link = isolated_home / ".ssh" / "known_hosts"
    link.symlink_to(target)
    with pytest.raises(ConnectError, match="cannot connect: Too many levels of symbolic links"):
        logs_in(ssh_lab, known_hosts=str(link) if where == "--known-hosts" else None, accept_new_host_keys=True)
    assert target.read_text() == "# not a known_hosts file\n"
    assert link.is_symlink()
