"""The health check between attempts, as a rule: the hosts of a failed attempt that fail it
(`HostActions.unhealthy`) are left out with those the policy leaves out, each taking a spare, or,
with `--min-hosts`, dropped as a lost host is while enough hosts remain (resize.py's rule); else, or
when one is this machine, the run stops naming them. Pure: fed what the check found, answering with
the restart (or the stop) and the causes it charges."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from launcher.config.quarantine import HEALTH_CHECK
from launcher.supervise import causes
from launcher.supervise.hosts import FleetView
from launcher.supervise.policy import GiveUp, Restart
from launcher.supervise.resize import place


def after_checks(restart: Restart, unhealthy: Mapping[str, str], fleet: FleetView,
                 min_hosts: int = 0) -> tuple[Restart | GiveUp, list[causes.Cause]]:
    """The restart with every unhealthy host (host -> why) left out too, and their causes."""
    found = {host: why for host, why in unhealthy.items() if host not in restart.left_out}
    judged = [causes.Cause(HEALTH_CHECK, None, host, why) for host, why in found.items()]
    if not found:
        return restart, judged
    here = [host for host in found if not fleet.may_leave_out(host)]
    if here:
        return GiveUp(f"{here[0]} failed its health check ({found[here[0]]}); it is this machine, which is "
                      f"never left out"), judged
    changed = Restart(_without(restart.notice, restart.left_out, restart.left_out + tuple(found)),
                      leave_out=restart.leave_out, leave_out_too=restart.leave_out_too + tuple(found))
    placed = place(changed.left_out, fleet, min_hosts)
    if not placed.goes_on:
        return GiveUp(placed.reason, left_out=changed.left_out, fewer=placed.fewer), judged
    return dataclasses.replace(changed, dropped=placed.dropped), judged


def _without(notice: str, before: tuple[str, ...], after: tuple[str, ...]) -> str:
    """The restart's notice naming every host left out."""
    if before:
        return notice.replace(f" without {', '.join(before)}", f" without {', '.join(after)}", 1)
    return notice.replace("restarting all tasks", f"restarting all tasks without {', '.join(after)}", 1)
