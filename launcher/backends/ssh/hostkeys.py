"""SSH host keys: names and fingerprints written the way OpenSSH writes them, and the policy for unknown keys."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import threading

import paramiko

from launcher.errors import HostKeyError
from launcher.backends.ssh import known_hosts

_known_hosts_lock = threading.Lock()


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line uses: `host` on port 22, else `[host]:port`."""
    return host if port == 22 else f"[{host}]:{port}"


def sha256_fingerprint(key_blob: bytes) -> str:
    """`SHA256:...` as printed by ssh and ssh-keygen -l."""
    digest = hashlib.sha256(key_blob).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_line(host: str, port: int, key_type: str, key_base64: str) -> str:
    return f"{known_hosts_name(host, port)} {key_type} {key_base64}\n"


def default_known_hosts() -> str:
    return os.path.expanduser("~/.ssh/known_hosts")


def unknown_key_message(host: str, port: int, key_type: str, fingerprint: str, known_hosts: str) -> str:
    keyscan = f"ssh-keyscan -t {key_type}" + (f" -p {port}" if port != 22 else "") + f" {shlex.quote(host)}"
    return (
        f"{known_hosts_name(host, port)}: unknown host key {key_type} {fingerprint}; "
        f"if that fingerprint is right, rerun with --accept-new-host-keys "
        f"or add it with: {keyscan} >> {shlex.quote(known_hosts)}"
    )


def changed_key_message(host: str, port: int, key_type: str, fingerprint: str) -> str:
    name = known_hosts_name(host, port)
    return (
        f"{name}: HOST KEY CHANGED, now {key_type} {fingerprint}; refusing to connect "
        f"(someone may be intercepting the connection). If the host was reinstalled, "
        f"remove the old key with: ssh-keygen -R {shlex.quote(name)}"
    )


def revoked_key_message(name: str, key_type: str, fingerprint: str) -> str:
    return f"{name}: host key {key_type} {fingerprint} is marked @revoked in known_hosts; refusing to connect"


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Every host key is judged here against the entries of every known_hosts file (the client
    itself is given none, so paramiko asks for each): revoked and changed keys are refused;
    unknown ones too, or recorded (StrictHostKeyChecking=accept-new)."""

    def __init__(self, accept_new: bool, record_in: str, entries: list[known_hosts.KnownKey]):
        self.accept_new = accept_new
        self.record_in = record_in
        self.entries = entries

    def missing_host_key(self, client, hostname, key):
        host, port = split_known_hosts_name(hostname)
        blob = key.asbytes()
        fingerprint = sha256_fingerprint(blob)
        verdict = known_hosts.judge(self.entries, hostname, key.get_name(), blob)
        if verdict.revoked:
            raise HostKeyError(revoked_key_message(hostname, key.get_name(), fingerprint))
        if verdict.trusted:
            return
        if verdict.other_keys_of_type:
            raise HostKeyError(changed_key_message(host, port, key.get_name(), fingerprint))
        if not self.accept_new:
            raise HostKeyError(unknown_key_message(host, port, key.get_name(), fingerprint, self.record_in))
        with _known_hosts_lock:
            directory = os.path.dirname(self.record_in)
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, mode=0o700, exist_ok=True)
            # 0600 whatever the umask; O_NOFOLLOW: a link planted in its place gets nothing.
            fd = os.open(self.record_in, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(known_hosts_line(host, port, key.get_name(), key.get_base64()))
        self.entries.append(known_hosts.KnownKey(hostname, key.get_name(), blob, revoked=False))


def split_known_hosts_name(name: str) -> tuple[str, int]:
    if name.startswith("[") and "]:" in name:
        host, port = name[1:].rsplit("]:", 1)
        return host, int(port)
    return name, 22
