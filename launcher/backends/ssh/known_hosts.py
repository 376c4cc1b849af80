"""known_hosts files read as OpenSSH reads them.

Every line of ~/.ssh/known_hosts and of --known-hosts counts: a key is trusted when any line
of either file lists it for the host. Lines are `[@marker] patterns keytype base64 [comment]`;
patterns are comma-separated names with `*` and `?` wildcards and `!` negations, `[host]:port`
for other ports than 22, or one hashed name (`|1|salt|hash`). `@revoked` keys are refused
whatever else says; `@cert-authority` lines (host certificates) are not supported and are
skipped with a warning, as is every line that cannot be read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import os
import re
import sys
import threading

from launcher.errors import UsageError
from launcher.host.files import MAX_KNOWN_HOSTS_BYTES, read_input_file

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"

_warned: set[tuple[str, int]] = set()
_warn_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class KnownKey:
    patterns: str
    key_type: str
    blob: bytes
    revoked: bool


def warn_once(path: str, number: int, problem: str) -> None:
    with _warn_lock:
        if (path, number) in _warned:
            return
        _warned.add((path, number))
    print(f"mgpu: warning: {path}:{number}: {problem}; line skipped", file=sys.stderr, flush=True)


def parse_line(line: str, path: str, number: int) -> KnownKey | None:
    """One line's entry; None for blank lines, comments and lines skipped with a warning."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = fields.pop(0) if fields[0].startswith("@") else None
    if marker == CERT_AUTHORITY:
        warn_once(path, number, "@cert-authority (host certificates) is not supported")
        return None
    if marker not in (None, REVOKED):
        warn_once(path, number, f"unknown marker {marker}")
        return None
    if len(fields) < 3:
        warn_once(path, number, "not 'host-patterns key-type key'")
        return None
    try:
        blob = base64.b64decode(fields[2], validate=True)
    except (binascii.Error, ValueError):
        warn_once(path, number, "the key is not valid base64")
        return None
    return KnownKey(fields[0], fields[1], blob, marker == REVOKED)


def load(paths: list[str]) -> list[KnownKey]:
    """Entries of every file that exists (unreadable ones, and those that are not regular files
    or hold more than MAX_KNOWN_HOSTS_BYTES, are skipped with a warning)."""
    entries = []
    for path in paths:
        if not os.path.lexists(path):
            continue
        try:
            lines = read_input_file(path, "", MAX_KNOWN_HOSTS_BYTES).decode("utf-8", "replace").splitlines()
        except UsageError as e:
            print(f"mgpu: warning: {e}; skipped", file=sys.stderr, flush=True)
            continue
        for number, line in enumerate(lines, start=1):
            entry = parse_line(line, path, number)
            if entry is not None:
                entries.append(entry)
    return entries


def _hashed_match(pattern: str, name: str) -> bool:
    parts = pattern.split("|")  # "", "1", salt, hash
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def _wildcard(pattern: str) -> re.Pattern:
    """OpenSSH patterns: `*` and `?` are wildcards, everything else (`[` included) is literal."""
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower()))


def matches(patterns: str, name: str) -> bool:
    """Whether known_hosts patterns match `name` (`host`, or `[host]:port`)."""
    if patterns.startswith("|"):
        return _hashed_match(patterns, name)
    found = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if _wildcard(pattern.lstrip("!")).fullmatch(name.lower()):
            if negated:
                return False
            found = True
    return found


@dataclasses.dataclass(frozen=True)
class Verdict:
    trusted: bool
    revoked: bool
    other_keys_of_type: bool  # the host is known with other keys of this type: the key changed


def judge(entries: list[KnownKey], name: str, key_type: str, blob: bytes) -> Verdict:
    for_host = [e for e in entries if matches(e.patterns, name)]
    revoked = any(e.revoked and e.blob == blob for e in for_host)
    valid = [e for e in for_host if not e.revoked]
    return Verdict(
        trusted=any(e.blob == blob for e in valid),
        revoked=revoked,
        other_keys_of_type=any(e.key_type == key_type and e.blob != blob for e in valid),
    )


def known_types(entries: list[KnownKey], name: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.key_type for e in entries if not e.revoked and matches(e.patterns, name)))
