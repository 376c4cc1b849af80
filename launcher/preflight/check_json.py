"""The host checks' table as a JSON document: what `mgpu check --json` prints, and what a launch
keeps in its run folder as checks.json for `mgpu report`. Pure: the checks' reports in, a dict out.

Each row is a host's check (`table_json`) with its speed probe's figures, where the probe ran, and
the figures that make it slow; `unreachable` is the reachability test's problems and `slow_hosts`
the hosts far below the others. `bounded` cuts the document to a size a reader takes whole.
"""

from __future__ import annotations

import json
from typing import Sequence

from launcher.preflight.check import table_json
from launcher.preflight.host_report import HostReport
from launcher.preflight.speed import HostSpeed, by_slow_host, slow_hosts
from launcher.supervise.rundir import MAX_CHECKS_BYTES

COMPACT = (",", ":")


def document(reports: Sequence[HostReport], speeds: Sequence[HostSpeed], unreachable: Sequence[str]) -> dict:
    named = by_slow_host(slow_hosts(speeds))
    by_name = {speed.host: speed for speed in speeds}
    rows = table_json(reports)
    for row in rows:
        speed = by_name.get(row["host"])
        row["speed"] = None if speed is None else {
            **speed.as_json(), "slow": [figure.as_json() for figure in named.get(row["host"], [])]}
    return {"hosts": rows, "unreachable": list(unreachable), "slow_hosts": list(named)}


def bounded(doc: dict, limit: int = MAX_CHECKS_BYTES) -> str:
    """The document as JSON of at most `limit` bytes: the hosts' rows that fit, in order, and how
    many did not (`hosts_left_out`); the reachability problems cut the same way."""
    text = json.dumps(doc, separators=COMPACT)
    if len(text.encode()) <= limit:
        return text
    cut = {**doc, "hosts": [], "unreachable": [], "hosts_left_out": len(doc["hosts"])}
    size = len(json.dumps(cut, separators=COMPACT).encode()) + 16  # room for the count's digits
    for field in ("hosts", "unreachable"):
        for item in doc[field]:
            more = len(json.dumps(item, separators=COMPACT).encode()) + 1
            if size + more > limit:
                break
            cut[field].append(item)
            size += more
    cut["hosts_left_out"] = len(doc["hosts"]) - len(cut["hosts"])
    return json.dumps(cut, separators=COMPACT)
