"""Fixtures for the SSH tests: real sshd servers (see ssh_helpers.py), an SshBackend for them and an isolated HOME."""

from __future__ import annotations

import getpass
import pathlib
import sys
from typing import Iterator

import pytest

from launcher.backends.ssh.backend import SshBackend

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # for `import ssh_helpers`

from namespace_labs import HostsLab, hosts_lab  # noqa: E402
from netns_hosts import Netns, require_namespaces  # noqa: E402
from ssh_helpers import SSHD, SshLab, keygen, require_tools, start_sshd  # noqa: E402


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory) -> Iterator[SshLab]:
    require_tools(SSHD, "ssh-keygen")
    directory = tmp_path_factory.mktemp("sshlab")
    client_key, wrong_key = directory / "id_client", directory / "id_wrong"
    authorized = directory / "authorized_keys"
    authorized.write_text(keygen(client_key) + "\n")
    keygen(wrong_key)
    servers = []
    try:
        servers.append(start_sshd(directory, "a", authorized))
        servers.append(start_sshd(directory, "b", authorized))
        a, b = servers
        known_hosts = directory / "known_hosts"
        known_hosts.write_text(a.known_hosts_line() + b.known_hosts_line())
        user = getpass.getuser()
        ssh_config = directory / "ssh_config"
        ssh_config.write_text(
            "".join(
                f"Host sshd-{s.name}\n  HostName {s.address}\n  Port {s.port}\n  User {user}\n  IdentityFile {client_key}\n"
                for s in servers
            )
        )
        yield SshLab(directory, user, client_key, wrong_key, authorized, a, b, known_hosts, ssh_config)
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def runner(ssh_lab: SshLab) -> Iterator[SshBackend]:
    """An SshBackend with the lab's ssh config and known_hosts (a 2 s grace period), closed after the test."""
    r = SshBackend(ssh_lab.options(), grace_period=2)
    yield r
    r.close()


@pytest.fixture(scope="module")
def netns(ssh_lab: SshLab, tmp_path_factory, request):
    """Hosts h1 and h2 in network namespaces, each with its sshd on port 22; `inner`, an sshd on h1's
    loopback that only h1 reaches (ProxyJump h1); an ssh config and known_hosts for them all.

    A test module that sets NETNS_PRIVATE_DIR (an absolute path) gives h1 and h2 a tmpfs each
    there: hosts that share no folder with each other or with this machine."""
    import subprocess

    require_namespaces()
    private_dir = getattr(request.module, "NETNS_PRIVATE_DIR", None)
    if private_dir:
        pathlib.Path(private_dir).mkdir(parents=True, exist_ok=True)
    directory = tmp_path_factory.mktemp("netns")
    lab = Netns.create()
    servers = []
    try:
        for name, address in lab.hosts.items():
            servers.append(start_sshd(directory, name, ssh_lab.authorized_keys, address=address, port=22,
                                      netns=lab.namespaces[name], private_dir=private_dir))
            lab.sshds[name] = servers[-1]
        # A host only h1 can reach: an sshd on the loopback of h1's namespace.
        inner = start_sshd(directory, "inner", ssh_lab.authorized_keys, address="127.0.0.1", port=22,
                           netns=lab.namespaces["h1"])
        servers.append(inner)
        known = directory / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in servers))
        config = directory / "ssh_config"
        config.write_text(
            "".join(f"Host {n}\n  HostName {a}\n  IdentityFile {ssh_lab.client_key}\n" for n, a in lab.hosts.items())
            + f"Host inner\n  HostName 127.0.0.1\n  ProxyJump h1\n  IdentityFile {ssh_lab.client_key}\n"
            # Aliases that only this machine's ssh config knows: no name service in the namespaces has them.
            + "".join(f"Host gpu-{n}\n  HostName {a}\n  IdentityFile {ssh_lab.client_key}\n"
                      for n, a in lab.hosts.items())
            + f"Host *\n  User {ssh_lab.user}\n"
        )
        yield lab, known, config, directory
    finally:
        for server in servers:
            server.stop()
        lab.destroy()
        assert not any(ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                       for ns in lab.namespaces.values())
        if private_dir:
            try:
                pathlib.Path(private_dir).rmdir()
            except OSError:
                pass


@pytest.fixture(scope="module")
def lab_of_three(ssh_lab: SshLab, tmp_path_factory) -> Iterator[HostsLab]:
    """Hosts h1, h2 and h3 in network namespaces, each with its sshd on port 22; their known_hosts and
    ssh config."""
    with hosts_lab(ssh_lab, tmp_path_factory.mktemp("spares"), ("h1", "h2", "h3")) as lab:
        yield lab


@pytest.fixture(scope="module")
def lab_of_five(ssh_lab: SshLab, tmp_path_factory) -> Iterator[HostsLab]:
    """Hosts h1 to h5 in network namespaces, each with its sshd on port 22; their known_hosts and ssh
    config."""
    with hosts_lab(ssh_lab, tmp_path_factory.mktemp("lost"), ("h1", "h2", "h3", "h4", "h5")) as lab:
        yield lab


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> pathlib.Path:
    """A HOME of the test's own (no ~/.ssh of the machine) and no ssh-agent."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home
