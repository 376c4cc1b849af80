"""Hostfiles: `host[:port]` per line, or the `host slots=N` form of Horovod, DeepSpeed and MPI."""

from __future__ import annotations

from launcher.config.addresses import Endpoint, is_number, parse_endpoint
from launcher.errors import SpecError


def parse_hostfile(text: str, source: str) -> tuple[tuple[Endpoint, int], ...]:
    """(endpoint, slots) per line. `source` names the file in messages."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        first, *options = line.split()
        try:
            endpoint = parse_endpoint(first)
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        slots = 1
        for option in options:
            key, sep, value = option.partition("=")
            if key not in ("slots", "max_slots") or not sep:
                raise SpecError(f"{where}: unknown setting {option!r} (expected slots=N)")
            if not is_number(value) or int(value) < 1:
                raise SpecError(f"{where}: {key} must be a positive number, not {value!r}")
            if key == "slots":  # max_slots is an MPI oversubscription limit; one task per slot ignores it
                slots = int(value)
        entries.append((endpoint, slots))
    if not entries:
        raise SpecError(f"{source}: no hosts in the hostfile")
    return tuple(entries)


