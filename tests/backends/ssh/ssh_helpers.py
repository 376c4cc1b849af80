"""Helpers for the SSH tests: real OpenSSH servers on loopback ports or in network namespaces.

Without /usr/sbin/sshd (or ip, for namespaces) these tests skip; with MGPU_REQUIRE_SSHD=1 they fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
