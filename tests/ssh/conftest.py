"""Real OpenSSH servers for the SSH tests, on loopback ports or inside network namespaces.

Without /usr/sbin/sshd (or ip, for namespaces) these tests skip; with MGPU_REQUIRE_SSHD=1 they fail.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from typing import Iterator

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
REQUIRE = os.environ.get("MGPU_REQUIRE_SSHD") == "1"
REPO = pathlib.Path(__file__).resolve().parents[2]
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


def start_sshd(directory: pathlib.Path, name: str, authorized_keys: pathlib.Path, address: str = "127.0.0.1",
               port: int | None = None, netns: str | None = None, extra: str = "") -> Sshd:
    """Start `sshd -D -e -f <config>` and wait until it listens."""
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
        "LogLevel DEBUG\n"
        + extra
    )
    log = directory / f"{name}.log"
    argv = [SSHD, "-D", "-e", "-f", str(config)]
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
        from launcher.runners.ssh_options import SshOptions

        settings = dict(known_hosts=str(self.known_hosts), ssh_config=str(self.ssh_config), connect_timeout=5.0,
                        kill_grace=2)
        settings.update(overrides)
        return SshOptions(**settings)


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


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> pathlib.Path:
    """A HOME of the test's own (no ~/.ssh of the machine) and no ssh-agent."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def run_processes(run_id: str) -> list[psutil.Process]:
    """Processes on this machine tagged with the run id (remote tasks here are local processes)."""
    found = []
    needle = f"MGPU_RUN_ID={run_id}"
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MGPU_RUN_ID") == run_id or any(needle in part for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
