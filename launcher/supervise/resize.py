"""Where the tasks of the hosts a restart leaves out go: the policy's rule for spares and for a run
on fewer hosts (`--min-hosts`). Pure, as the policy is: it sees the run's hosts as data (FleetView).

Each host left out takes the next spare, in the spares' order. Hosts left without a spare have
their tasks dropped when the hosts that remain are at least `--min-hosts`: the plans are then made
again for the hosts left (the fleet's `shrink`) and the whole cluster restarts from its checkpoint.
Otherwise the run stops, naming the hosts and the command that relaunches without them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from launcher.supervise.hosts import FleetView, place_on_spares


@dataclasses.dataclass(frozen=True)
class Placed:
    """Whether the run goes on once `left_out` are left out, and without which hosts."""

    goes_on: bool
    dropped: tuple[str, ...] = ()  # hosts with no spare left, whose tasks are dropped
    reason: str = ""  # why it cannot go on
    fewer: str = ""  # the part of it that --min-hosts says


def place(left_out: Sequence[str], fleet: FleetView | None, min_hosts: int = 0) -> Placed:
    """The run goes on if the fleet has a spare for every host in `left_out`, or (with `min_hosts`)
    if the hosts that remain once those without a spare are dropped are at least `min_hosts`. The
    first hosts charged take the spares there are. `fleet` None: spares are not counted here."""
    left_out = tuple(left_out)
    if fleet is None or place_on_spares(left_out, fleet.spares) is not None:
        return Placed(True)
    dropped = left_out[len(fleet.spares):]
    remain = len([host for host in fleet.in_use if host not in dropped])
    if min_hosts and remain >= min_hosts:
        return Placed(True, dropped)
    fewer = f"the {remain} host{'s' if remain != 1 else ''} left would be fewer than --min-hosts {min_hosts}" \
        if min_hosts else ""
    return Placed(False, reason=f"no spare host left to take the tasks of {', '.join(left_out)}"
                  + (f"; {fewer}" if fewer else ""), fewer=fewer)
