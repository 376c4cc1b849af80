"""`nvidia-smi -q` where a task runs: the state of the host's GPUs (their memory, utilisation,
clocks, ECC and retired pages, throttling, the processes on them) as a stalled job left them.

One shell script does it on every host: it says whether nvidia-smi is on the task's PATH, and if so
its exit status and its output, under `timeout` (a GPU in trouble can hold nvidia-smi in the driver)
and cut to OUTPUT_LIMIT bytes, between marker lines of a random word. What comes back is read as
untrusted text (parse_answer); standard library only."""

from __future__ import annotations

import dataclasses
import re
import secrets

QUERY_TIMEOUT = 20  # seconds nvidia-smi may take on the host
OUTPUT_LIMIT = 1 << 20  # bytes of its output kept: eight GPUs' -q is about 100 KiB
TIMED_OUT = 137  # coreutils timeout's status after -s KILL


@dataclasses.dataclass(frozen=True)
class Query:
    """What a host answered: whether it has nvidia-smi, its exit status and its output."""
    found: bool
    status: int | None = None
    text: str = ""


def new_nonce() -> str:
    return secrets.token_hex(8)


def script(nonce: str) -> str:
    mark = f"\x1emgpu-smi-{nonce}"
    return "\n".join([
        f"n=$(command -v nvidia-smi 2>/dev/null) || {{ printf '{mark} missing\\n'; exit 0; }}",
        f't=; command -v timeout >/dev/null 2>&1 && t="timeout -s KILL {QUERY_TIMEOUT}"',
        "f=$(mktemp) || exit 1",
        "trap 'rm -f \"$f\"' EXIT",
        '$t "$n" -q >"$f" 2>&1 </dev/null',
        f"printf '{mark} status %s\\n' \"$?\"",
        f'head -c {OUTPUT_LIMIT} "$f"',
    ])


def answer_limit() -> int:
    """The bytes of the script's output read: its output and the marker lines."""
    return OUTPUT_LIMIT + 4096


_STATUS = re.compile(r"^(\d{1,5})\n")


def parse_answer(out: bytes, nonce: str) -> Query | None:
    """The script's output read as untrusted: None where it says nothing readable."""
    text = out.decode("utf-8", "replace")
    mark = f"\x1emgpu-smi-{nonce} "
    if text.startswith(mark + "missing\n"):
        return Query(False)
    if not text.startswith(mark + "status "):
        return None
    rest = text[len(mark + "status "):]
    status = _STATUS.match(rest)
    if status is None:
        return None
    return Query(True, int(status.group(1)), rest[status.end():][:OUTPUT_LIMIT])
