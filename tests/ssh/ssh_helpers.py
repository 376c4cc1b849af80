"""Helpers for the SSH tests: real OpenSSH servers on loopback ports or in network namespaces.

Without /usr/sbin/sshd (or ip, for namespaces) these tests skip; with MGPU_REQUIRE_SSHD=1 they fail.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

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
               port: int | None = None, netns: str | None = None, log_level: str = "INFO", extra: str = "") -> Sshd:
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
        f"LogLevel {log_level}\n"
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
