"""Hostfiles: `host[:port]` per line, or the `host slots=N` form of Horovod, DeepSpeed and MPI.

As in OpenMPI: `max-slots`/`max_slots` is read (and must not be below `slots`), spaces around
`=` are allowed, and a host listed on several lines gets the sum of its slots. A host may be a
Slurm hostlist (`node[01-04] slots=4`), which stands for each of its hosts.
"""

from __future__ import annotations

import re

from launcher.config.addresses import Endpoint, is_number, parse_endpoint
from launcher.config.hostlist import check_task_total, count_entry, expand_entry
from launcher.errors import SpecError

_SETTINGS = ("slots", "max_slots")


def parse_hostfile(text: str, source: str) -> tuple[tuple[Endpoint, int], ...]:
    """(endpoint, slots) per host, in the order hosts first appear. `source` names the file in messages."""
    slots_of: dict[Endpoint, int] = {}
    max_of: dict[Endpoint, tuple[int, str]] = {}  # the smallest max_slots given, and where
    total = 0  # tasks so far, counted before each line is expanded
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"\s*=\s*", "=", raw.split("#", 1)[0].strip())
        if not line:
            continue
        where = f"{source}:{number}"
        first, *options = line.split()
        settings = _settings(options, where)
        slots = settings.get("slots", 1)
        try:
            total += count_entry(first) * slots
            check_task_total(total)
            endpoints = [parse_endpoint(entry) for entry in expand_entry(first)]
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if "max_slots" in settings and settings["max_slots"] < slots:
            raise SpecError(f"{where}: max_slots={settings['max_slots']} is below slots={slots}")
        for endpoint in endpoints:
            slots_of[endpoint] = slots_of.get(endpoint, 0) + slots
            if "max_slots" in settings and settings["max_slots"] < max_of.get(endpoint, (1 << 30, ""))[0]:
                max_of[endpoint] = (settings["max_slots"], where)
    if not slots_of:
        raise SpecError(f"{source}: no hosts in the hostfile")
    for endpoint, (limit, where) in max_of.items():
        if slots_of[endpoint] > limit:
            raise SpecError(f"{where}: {endpoint} has {slots_of[endpoint]} slots in all, over its max_slots={limit}")
    return tuple(slots_of.items())


def _settings(options: list[str], where: str) -> dict[str, int]:
    """`slots=N` and `max_slots=N` (also written `max-slots`), as numbers."""
    settings = {}
    for option in options:
        key, sep, value = option.partition("=")
        key = key.replace("-", "_")
        if key not in _SETTINGS or not sep:
            raise SpecError(f"{where}: unknown setting {option!r} (expected slots=N)")
        if not is_number(value) or int(value) < 1:
            raise SpecError(f"{where}: {key} must be a positive number, not {value!r}")
        settings[key] = int(value)
    return settings
