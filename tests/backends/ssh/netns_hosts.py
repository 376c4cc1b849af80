"""Hosts in network namespaces of their own, joined by a bridge: each with its own addresses, its own
/etc/hosts and, once started, its own sshd; a host can be lost (its link down, its processes killed).

Without ip or root these tests skip; with MGPU_REQUIRE_SSHD=1 they fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import pathlib
import shutil
import subprocess
import time
from typing import Iterator

import psutil
import pytest
from ssh_helpers import REQUIRE, Sshd, require_tools


def lose(lab: "Netns", name: str) -> None:
    """Host `name` of `lab` dies: its link goes down, then every process in its namespace is killed."""
    ip("-n", lab.namespaces[name], "link", "set", "eth0", "down")
    for pid in ip("netns", "pids", lab.namespaces[name]).stdout.split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass


def require_namespaces() -> None:
    require_tools("ip")
    if os.geteuid() != 0:
        reason = "network namespaces need root"
        if REQUIRE:
            pytest.fail(reason + " and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip(reason)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _namespace_pids(name: str) -> list[int]:
    done = ip("netns", "pids", name, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def remove_namespace(name: str) -> None:
    """Kill what runs in a namespace, delete it and its /etc/netns files."""
    for pid in _namespace_pids(name):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while _namespace_pids(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    ip("netns", "del", name, check=False)
    shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


NETNS_PREFIX = "mgpu"
_LAB_NUMBERS = itertools.count()


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Held by one process of this machine at a time."""
    folder = "/run/lock" if os.path.isdir("/run/lock") else "/tmp"
    with open(os.path.join(folder, "mgpu-test-netns.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def remove_stale_namespaces() -> None:
    """Namespaces left by an earlier test run that was killed before its teardown."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name[len(NETNS_PREFIX):].split("-", 1)[0]
        if name.startswith(NETNS_PREFIX) and owner.isdigit() and not psutil.pid_exists(int(owner)):
            remove_namespace(name)


@dataclasses.dataclass
class Netns:
    """Hosts h1, h2 in their own network namespaces, joined by a bridge in a third namespace,
    with a veth from this (root) namespace into the bridge. Only 10.x addresses, nothing routed out.

    Each host has a second interface first, mgmt0, up and addressed on a network that joins
    nothing (as a GPU node's management network beside its fabric): a program that picks the
    first interface it likes picks the wrong one."""

    prefix: str
    subnet: str  # "10.213.N"
    hosts: dict[str, str]  # name -> address
    namespaces: dict[str, str]  # name -> namespace
    sshds: dict[str, Sshd] = dataclasses.field(default_factory=dict)  # name -> its sshd, once started

    @classmethod
    def create(cls, names=("h1", "h2")) -> "Netns":
        remove_stale_namespaces()
        # A lab of its own per call: a deleted namespace's links may linger a moment, so a second lab
        # of this process must not reuse the first one's names.
        lab_number = next(_LAB_NUMBERS)
        prefix = f"{NETNS_PREFIX}{os.getpid()}" + (f"-{lab_number}" if lab_number else "")
        # Test processes side by side (and the startup benchmark) make labs at the same moment: the
        # subnet is chosen and its route made under one lock, else two labs could take the same /24
        # and one's connections would reach the other's hosts.
        with _subnet_lock():
            subnet = None
            for third in range(200, 250):
                if not ip("route", "show", f"10.213.{third}.0/24").stdout.strip() and \
                        f"10.213.{third}." not in ip("-4", "addr").stdout:
                    subnet = f"10.213.{third}"
                    break
            assert subnet, "no free 10.213.x.0/24 subnet"
            lab = cls(prefix, subnet, {n: f"{subnet}.{11 + i}" for i, n in enumerate(names)},
                      {n: f"{prefix}-{n}" for n in names})
            bridge_ns = f"{prefix}-br"
            root_if = f"mg{os.getpid()}r{lab_number or ''}"[:15]
            try:
                ip("netns", "add", bridge_ns)
                ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
                ip("-n", bridge_ns, "link", "set", "br0", "up")
                ip("link", "add", root_if, "type", "veth", "peer", "name", "uplink", "netns", bridge_ns)
                ip("-n", bridge_ns, "link", "set", "uplink", "master", "br0", "up")
                ip("addr", "add", f"{subnet}.1/24", "dev", root_if)
                ip("link", "set", root_if, "up")
                hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in lab.hosts.items())
                for name, ns in lab.namespaces.items():
                    ip("netns", "add", ns)
                    ip("-n", ns, "link", "set", "lo", "up")
                    ip("-n", ns, "link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0-end")
                    ip("-n", ns, "addr", "add", f"10.214.{subnet.rsplit('.', 1)[1]}.{lab.hosts[name].rsplit('.', 1)[1]}/24",
                       "dev", "mgmt0")
                    ip("-n", ns, "link", "set", "mgmt0-end", "up")
                    ip("-n", ns, "link", "set", "mgmt0", "up")
                    ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"port-{name}", "netns", bridge_ns)
                    ip("-n", ns, "addr", "add", f"{lab.hosts[name]}/24", "dev", "eth0")
                    ip("-n", ns, "link", "set", "eth0", "up")
                    ip("-n", bridge_ns, "link", "set", f"port-{name}", "master", "br0", "up")
                    # `ip netns exec` mounts these over /etc/hosts, so the workers resolve h1, h2 by name.
                    os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                    pathlib.Path(f"/etc/netns/{ns}/hosts").write_text(hosts_file)
            except BaseException:
                lab.destroy()
                raise
        return lab

    def destroy(self) -> None:
        for ns in list(self.namespaces.values()) + [f"{self.prefix}-br"]:
            remove_namespace(ns)  # deleting a namespace deletes its veth ends, and so their peers
        try:
            os.rmdir("/etc/netns")  # only if no one else keeps files there
        except OSError:
            pass

    def net_inode(self, name: str) -> int:
        return os.stat(f"/run/netns/{self.namespaces[name]}").st_ino
