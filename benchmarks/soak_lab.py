"""The soak's hosts (benchmarks/soak.py): network namespaces joined by a bridge, each with its own
sshd on port 22, their known_hosts and an ssh config naming them, and a home for mgpu's own files;
with `private_dir`, each host sees a tmpfs of its own there (soak_private.py)."""

from __future__ import annotations

import getpass
import pathlib

from netns_hosts import Netns
from ssh_helpers import keygen, start_sshd


def make_lab(count: int, directory: pathlib.Path, private_dir: str | None = None) -> Netns:
    key, authorized = directory / "id", directory / "authorized_keys"
    authorized.write_text(keygen(key) + "\n")
    lab = Netns.create(names=[f"h{i + 1}" for i in range(count)])
    for name, address in lab.hosts.items():
        lab.sshds[name] = start_sshd(directory, name, authorized, address=address, port=22,
                                     netns=lab.namespaces[name], private_dir=private_dir)
    (directory / "known_hosts").write_text("".join(s.known_hosts_line() for s in lab.sshds.values()))
    (directory / "ssh_config").write_text("".join(
        f"Host {n}\n  HostName {a}\n  User {getpass.getuser()}\n  IdentityFile {key}\n" for n, a in lab.hosts.items()))
    (directory / "home").mkdir()
    return lab
