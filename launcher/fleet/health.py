"""The first start's hosts that failed the health check (`--health-check`, spec `health_check:`;
stages.check_health runs it, preflight/health.py on the hosts), left out for spares and quarantined."""

from __future__ import annotations

from typing import Callable

from launcher.config.quarantine import HEALTH_CHECK
from launcher.errors import CheckFailed


def leave_out_unhealthy(fleet, unhealthy: dict[str, str], notice: Callable[[str], None]) -> None:
    """The first start's hosts that failed the health check, each left out for a spare of its own
    (which passes the stages, its health check too) and quarantined; without a spare for one, or
    when one is this machine, the launch ends naming them."""
    fleet.remember_left_out({host: f"{HEALTH_CHECK}: {why}" for host, why in unhealthy.items()
                             if host not in fleet.this_machine}, notice)
    here = [host for host in unhealthy if host in fleet.this_machine]
    placement = None if here else fleet.replace(list(unhealthy), notice)
    if placement is None or placement.plans is None:
        lines = "\n".join(f"  {host}: {why}" for host, why in unhealthy.items())
        without = (f"{', '.join(here)} is this machine, which is never left out" if here else
                   "no spare host (--spare-hosts) passed its checks to take their tasks")
        raise CheckFailed(f"host(s) failed the health check ({without}):\n{lines}")
    for host, spare in placement.took:
        notice(f"left out {host}: its health check failed ({unhealthy[host]}); spare host {spare} takes its tasks")
