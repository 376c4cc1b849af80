"""The health check's stage (`--health-check`, spec `health_check:`; preflight/health.py runs it):
at the first start a host that fails it is set apart for the fleet to leave out (a spare takes its
tasks, or the launch ends naming it); a spare that fails it is skipped. Either is quarantined."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from launcher.config.quarantine import HEALTH_CHECK
from launcher.errors import CheckFailed

if TYPE_CHECKING:
    from launcher.fleet.stages import Preparing


def check_health(state: Preparing) -> None:
    command = state.fleet.options.health_check
    if not command:
        return
    from launcher.preflight.health import unhealthy_hosts

    unhealthy = unhealthy_hosts(state.mine(), command, state.fleet.ssh)
    if state.first:
        state.unhealthy.update(unhealthy)
        return
    for host, why in unhealthy.items():
        state.refuse([host], CheckFailed(f"its health check failed: {why}"))
    state.fleet.remember_left_out({host: f"{HEALTH_CHECK}: {why}" for host, why in unhealthy.items()}, state.notice)


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
