"""The quarantine, as data: hosts a run left out for a fault of the host, remembered for later runs
until an expiry, and what a new run makes of them. Pure: the file that keeps them is
host/quarantine_file.py.

The document is untrusted (another program, a disk error or a hand may have written it): its size,
its number of entries and each field's type, length and range are checked, and its texts must be
printable, so that whatever is shown of it needs no escaping. A document that fails any check is
refused whole (`Unreadable`): its keeper sets it aside and starts an empty one.

A run reads the hosts in force (`in_force`) and, before it plans (`avoiding`), gives the tasks of
each quarantined host to a spare where one is given, and drops quarantined spares; without a spare
the host keeps its tasks, with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from typing import Iterable, Mapping, Sequence

from launcher.config.addresses import parse_host
from launcher.config.spec import MAX_SECONDS, ClusterSpec, with_host_replaced

VERSION = 1
MAX_BYTES = 1 << 20  # a file larger than this is not one mgpu wrote
MAX_ENTRIES = 4096
MAX_CAUSE = 64
MAX_DETAIL = 400
MAX_RUN_ID = 256
DEFAULT_DURATION = 24 * 3600.0  # --quarantine's default
# The cause a failed health check leaves a host out with (beside causes.py's).
HEALTH_CHECK = "health-check"


class Unreadable(ValueError):
    """A quarantine document that fails a check; its message says which, in one line."""


@dataclasses.dataclass(frozen=True)
class Entry:
    host: str
    cause: str  # the cause it was left out for: host-lost, network, health-check, ...
    detail: str  # one printable line: what happened
    run_id: str  # the run that left it out
    since: float  # seconds since the epoch
    until: float  # the expiry: not quarantined from then on

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line for a warning: the cause, the run and the expiry."""
        return (f"{self.cause} in run {self.run_id}: {self.detail}; "
                f"until {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.until))}")


def printable(text: str, limit: int) -> str:
    """`text` as one printable line of at most `limit` characters, for what mgpu writes itself."""
    line = "".join(c if c.isprintable() else "?" for c in " ".join(str(text).split()))
    return line if len(line) <= limit else line[:limit - 3] + "..."


def parse_duration(text: str) -> float:
    """`--quarantine`: seconds, or a number with s, m, h or d (24h, 90m, 2d); 0 turns it off."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)", text.strip().lower())
    if not match:
        raise ValueError(f"{text!r} is not a duration (write it as 24h, 90m, 2d, a number of seconds, or 0: off)")
    seconds = float(match.group(1)) * units[match.group(2) or "s"]
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text!r}: at most {MAX_SECONDS / 86400:g} days")
    return seconds


def parse(text: str) -> tuple[Entry, ...]:
    """The entries of a quarantine document; Unreadable when any check fails."""
    if len(text) > MAX_BYTES:
        raise Unreadable(f"larger than {MAX_BYTES} bytes")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise Unreadable(f"not JSON ({str(e).splitlines()[0][:100]})") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("hosts"), list):
        raise Unreadable(f"not a quarantine document of version {VERSION} (an object with 'version' and 'hosts')")
    if len(data["hosts"]) > MAX_ENTRIES:
        raise Unreadable(f"more than {MAX_ENTRIES} hosts")
    return tuple(_entry(item, number) for number, item in enumerate(data["hosts"], 1))


def _entry(item: object, number: int) -> Entry:
    fields = {field.name: field for field in dataclasses.fields(Entry)}
    if not isinstance(item, dict) or set(item) != set(fields):
        raise Unreadable(f"host {number}: not an object with exactly {', '.join(fields)}")
    limits = {"host": 255, "cause": MAX_CAUSE, "detail": MAX_DETAIL, "run_id": MAX_RUN_ID}
    for name, limit in limits.items():
        value = item[name]
        if not isinstance(value, str) or len(value) > limit or not value.isprintable():
            raise Unreadable(f"host {number}: {name} is not printable text of at most {limit} characters")
    try:
        parse_host(item["host"])
    except ValueError as e:
        raise Unreadable(f"host {number}: {e}") from None
    for name in ("since", "until"):
        value = item[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise Unreadable(f"host {number}: {name} is not a time (seconds since the epoch)")
    if not item["since"] <= item["until"] <= item["since"] + MAX_SECONDS:
        raise Unreadable(f"host {number}: until is not within {MAX_SECONDS / 86400:g} days after since")
    return Entry(**{name: item[name] for name in fields})


def render(entries: Iterable[Entry]) -> str:
    return json.dumps({"version": VERSION, "hosts": [entry.to_dict() for entry in entries]}, indent=1) + "\n"


def in_force(entries: Iterable[Entry], now: float) -> dict[str, Entry]:
    """The hosts quarantined at `now` (not yet expired), each with its entry."""
    return {entry.host: entry for entry in entries if now < entry.until}


def with_added(entries: Sequence[Entry], added: Sequence[Entry], now: float) -> tuple[Entry, ...]:
    """The entries in force at `now`, each added one in place of an older entry of its host; at most
    MAX_ENTRIES, the newest kept."""
    new = {entry.host for entry in added}
    kept = [entry for entry in in_force(entries, now).values() if entry.host not in new] + list(added)
    return tuple(kept[-MAX_ENTRIES:])


def without(entries: Sequence[Entry], hosts: Iterable[str], now: float) -> tuple[Entry, ...]:
    """The entries in force at `now`, those of `hosts` lifted."""
    lifted = set(hosts)
    return tuple(entry for entry in in_force(entries, now).values() if entry.host not in lifted)


def entries_for(why: Mapping[str, str], run_id: str, now: float, duration: float) -> tuple[Entry, ...]:
    """An entry per host left out, from `why`: 'cause: detail', as the run says why it left it out."""
    made = []
    for host, reason in why.items():
        cause, _, detail = reason.partition(": ")
        made.append(Entry(printable(host, 255), printable(cause, MAX_CAUSE) or "failed",
                          printable(detail, MAX_DETAIL), printable(run_id, MAX_RUN_ID), now, now + duration))
    return tuple(made)


def avoiding(spec: ClusterSpec, quarantined: Mapping[str, Entry], this_machine: frozenset[str] = frozenset(),
             replace: bool = True) -> tuple[ClusterSpec, list[str]]:
    """The spec with each quarantined host's tasks on a spare that is not quarantined (when `replace`
    and one is left), quarantined spares dropped; and the warnings that say so. A host without a
    spare keeps its tasks; this machine is never avoided."""
    warnings = []
    bad_spares = [host for host in spec.spares if host in quarantined]
    for host in bad_spares:
        warnings.append(f"spare host {host} is quarantined ({quarantined[host].describe()}): not used as a spare")
    spec = dataclasses.replace(spec, spares=tuple(host for host in spec.spares if host not in quarantined))
    for host in dict.fromkeys(task.host for task in spec.tasks):
        if host not in quarantined or host in this_machine:
            continue
        said = f"{host} is quarantined ({quarantined[host].describe()})"
        if replace and spec.spares:
            spare = spec.spares[0]
            spec = with_host_replaced(spec, host, spare)
            warnings.append(f"{said}: spare host {spare} takes its tasks")
        else:
            warnings.append(f"{said}; no spare host takes its place, so it runs its tasks "
                            f"(`mgpu hosts --clear {host}` lifts the quarantine)")
    return spec, warnings
