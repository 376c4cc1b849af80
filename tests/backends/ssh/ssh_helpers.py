"""Helpers for the SSH tests: real OpenSSH servers on loopback ports or in network namespaces.

Without /usr/sbin/sshd (or ip, for namespaces) these tests skip; with MGPU_REQUIRE_SSHD=1 they fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Iterator

import psutil
import pytest
from launcher.host import proctree
from launching import free_port

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
REQUIRE = os.environ.get("MGPU_REQUIRE_SSHD") == "1"
PYTHON = sys.executable  # the remote hosts share this machine's filesystem


def require_tools(*tools: str) -> None:
    """Skip (or fail under MGPU_REQUIRE_SSHD=1) when a tool the test needs is missing."""
    missing = [t for t in tools if not (os.path.isabs(t) and os.access(t, os.X_OK)) and shutil.which(t) is None]
    if missing:
        reason = f"needs {', '.join(missing)} (apt-get install openssh-server iproute2)"
        if REQUIRE:
            pytest.fail(reason + " and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip(reason)


def keygen(path: pathlib.Path, comment: str = "mgpu-test") -> str:
    """Generate an ed25519 key pair without passphrase; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return pathlib.Path(str(path) + ".pub").read_text().strip()


@dataclasses.dataclass
class Sshd:
    name: str
    address: str
    port: int
    host_key: pathlib.Path  # private key; .pub next to it
    log: pathlib.Path
    proc: subprocess.Popen

    @property
    def public_key(self) -> str:
        return pathlib.Path(str(self.host_key) + ".pub").read_text().split()[1]

    def known_hosts_line(self) -> str:
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{name} ssh-ed25519 {self.public_key}\n"

    def fingerprint(self) -> str:
        out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key) + ".pub"],
                             capture_output=True, text=True, check=True).stdout
        return out.split()[1]

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Suspend the server's connection processes: a network partition, or a host too busy to answer.
        OpenSSH 9.8 and later name them sshd-session (and sshd-auth); a freeze that found none fails."""
        procs = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:  # a session may end meanwhile (a task that ended, with its join reporter)
                if p.name() in ("sshd", "sshd-session", "sshd-auth"):
                    p.suspend()
                    procs.append(p)
            except psutil.NoSuchProcess:
                pass
        if not procs:
            raise AssertionError(f"sshd {self.name} has no connection process to freeze")
        try:
            yield
        finally:
            for p in procs:
                try:
                    p.resume()
                except psutil.Error:
                    pass

    def private_path(self, path: str) -> pathlib.Path:
        """`path` as the server's sessions see it (its private folder: see start_sshd)."""
        return pathlib.Path(f"/proc/{self.proc.pid}/root") / path.lstrip("/")

    def stop(self) -> None:
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for child in children:  # per-connection sshd processes outlive the listener
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(children, timeout=5)


def session_environment(account_startup_files: bool) -> str:
    """The SetEnv line of a test sshd's config (sshd reads one): SHLVL=1 (see start_sshd); and where
    `make test` keeps the bytecode cache (PYTHONPYCACHEPREFIX), the same for the hosts, which are
    this machine: a framework is then compiled once for the whole suite, not again for the hosts'
    tasks (which, without it, would write __pycache__ folders beside the venv's modules)."""
    variables = [] if account_startup_files else ["SHLVL=1"]
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        variables.append(f'"PYTHONPYCACHEPREFIX={os.environ["PYTHONPYCACHEPREFIX"]}"')
    return f"SetEnv {' '.join(variables)}\n" if variables else ""


def start_sshd(directory: pathlib.Path, name: str, authorized_keys: pathlib.Path, address: str = "127.0.0.1",
               port: int | None = None, netns: str | None = None, log_level: str = "INFO", extra: str = "",
               private_dir: str | None = None, account_startup_files: bool = False) -> Sshd:
    """Start `sshd -D -e -f <config>` and wait until it listens.

    Its sessions run the account's login shell but, unless `account_startup_files`, not its
    ~/.bashrc: bash reads that file for a command from sshd only at shell level 1. What this
    machine's account starts there (pyenv init: a hundred processes, 0.16 CPU-s a session) is not
    mgpu's; a test that needs a start-up file, slow or chatty, gives its host one with ForceCommand.
    The benchmarks keep it, as a user's host would.

    With `private_dir` (an existing folder), the server and its sessions see a tmpfs of their own
    there (a mount namespace of the server's): a host that shares no folder with the others. Its
    files are seen from here through /proc/PID/root (Sshd.private_path)."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    directory.mkdir(parents=True, exist_ok=True)
    host_key = directory / f"{name}_host_ed25519"
    if not host_key.exists():
        keygen(host_key, f"host-{name}")
    port = port or free_port(address)
    config = directory / f"{name}_sshd_config"
    config.write_text(
        f"Port {port}\n"
        f"ListenAddress {address}\n"
        f"HostKey {host_key}\n"
        f"AuthorizedKeysFile {authorized_keys}\n"
        "PidFile none\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PrintMotd no\n"
        "AllowTcpForwarding yes\n"
        "MaxStartups 50\n"
        + session_environment(account_startup_files)
        # As the distributions' sshd_config has it: --sync copies over SFTP.
        + (f"Subsystem sftp {SFTP_SERVER}\n" if os.path.exists(SFTP_SERVER) else "") +
        f"LogLevel {log_level}\n"
        + extra
    )
    log = directory / f"{name}.log"
    argv = [SSHD, "-D", "-e", "-f", str(config)]
    if private_dir:
        argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                'mount -t tmpfs -o mode=755 mgpu-private "$0" && exec "$@"', private_dir] + argv
    if netns:
        argv = ["ip", "netns", "exec", netns] + argv
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    sshd = Sshd(name, address, port, host_key, log, proc)
    deadline = time.monotonic() + 10
    while b"Server listening" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            sshd.stop()
            raise RuntimeError(f"sshd {name} did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return sshd


@dataclasses.dataclass
class SshLab:
    """Two loopback sshd servers, keys, a known_hosts file and an ssh config naming them."""

    dir: pathlib.Path
    user: str
    client_key: pathlib.Path
    wrong_key: pathlib.Path
    authorized_keys: pathlib.Path
    a: Sshd
    b: Sshd
    known_hosts: pathlib.Path  # trusts a and b
    ssh_config: pathlib.Path  # Host sshd-a, sshd-b

    def options(self, **overrides):
        from launcher.backends.ssh.options import SshOptions

        settings = dict(known_hosts=str(self.known_hosts), ssh_config=str(self.ssh_config), connect_timeout=5.0)
        settings.update(overrides)
        return SshOptions(**settings)


def unique_run_id(name: str) -> str:
    """A run id no other test run uses: the run id is also the tag that finds (and kills) a run's processes."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


@dataclasses.dataclass
class SilentListener:
    port: int
    accepted: list  # sockets of the connections it took


@contextlib.contextmanager
def silent_listener() -> Iterator[SilentListener]:
    """A loopback TCP server that accepts connections and never sends a byte (a hung sshd)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    listener = SilentListener(server.getsockname()[1], [])
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            listener.accepted.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        stop.set()
        thread.join(5)
        for conn in listener.accepted:
            conn.close()
        server.close()


def run_processes(run_id: str) -> list[psutil.Process]:
    """Processes on this machine tagged with the run id (remote tasks here are local processes)."""
    found = []
    needle = f"MGPU_RUN_ID={run_id}"
    for proc in proctree.every_process():
        try:
            if proc.environ().get("MGPU_RUN_ID") == run_id or any(needle in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


# Arguments and values that a careless shell command line would mangle.
TRICKY = [
    "plain",
    "with space",
    "it's \"quoted\"",
    "$(touch /tmp/mgpu-should-not-exist)",
    "`id`",
    "line1\nline2\n",
    "tab\there; semi; && || | > <",
    "ünïcödé ✓ 日本",
    "$HOME ${PATH} \\ \\\\",
    "",
    "-dash",
    "*",
]

ECHO_PROGRAM = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in sys.argv[1:2]},"
    " 'cwd': os.getcwd()}))\n"
)


# -- network namespaces ---------------------------------------------------------------------


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
