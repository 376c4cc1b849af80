"""Labs of hosts in network namespaces, each with its sshd on port 22, made one way for the fixtures
that need three or five of them (conftest.py's lab_of_three and lab_of_five), and a lost host
brought back after the test that lost it."""

from __future__ import annotations

import contextlib
import pathlib
from typing import Iterator, NamedTuple

from netns_hosts import Netns, ip, require_namespaces
from ssh_helpers import SshLab, start_sshd


class HostsLab(NamedTuple):
    """Hosts in namespaces (lab), their known_hosts and ssh config, their sshds by name, the folder of
    their files and the loopback lab whose keys they trust."""

    lab: Netns
    known: pathlib.Path
    config: pathlib.Path
    servers: dict
    directory: pathlib.Path
    ssh_lab: SshLab

    def bring_back(self, names) -> None:
        """Hosts `names` as they were before a test lost them: the link up, and where the sshd died,
        a new one with the same host key."""
        for name in names:
            ip("-n", self.lab.namespaces[name], "link", "set", "eth0", "up")
            if self.servers[name].proc.poll() is not None:
                self.servers[name] = start_sshd(self.directory, name, self.ssh_lab.authorized_keys,
                                                address=self.lab.hosts[name], port=22, netns=self.lab.namespaces[name])


@contextlib.contextmanager
def hosts_lab(ssh_lab: SshLab, directory: pathlib.Path, names: tuple[str, ...],
              private_dir: str | None = None) -> Iterator[HostsLab]:
    """Hosts `names` in network namespaces, each with its sshd on port 22 trusting the loopback lab's
    client key; stopped and removed on leaving. With `private_dir` (an existing folder), each host has
    a tmpfs of its own there (start_sshd): hosts that share no folder there."""
    require_namespaces()
    lab = Netns.create(names=names)
    servers = {}
    try:
        for name, address in lab.hosts.items():
            servers[name] = start_sshd(directory, name, ssh_lab.authorized_keys, address=address, port=22,
                                       netns=lab.namespaces[name], private_dir=private_dir)
        known = directory / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in servers.values()))
        config = directory / "ssh_config"
        config.write_text("".join(f"Host {n}\n  HostName {a}\n  IdentityFile {ssh_lab.client_key}\n"
                                  for n, a in lab.hosts.items()) + f"Host *\n  User {ssh_lab.user}\n")
        yield HostsLab(lab, known, config, servers, directory, ssh_lab)
    finally:
        for server in servers.values():
            server.stop()
        lab.destroy()
