"""`mgpu check --health-check CMD`: the health check a launch runs before its first start
(health.py), run here on every host that answered its login, its verdict in the host's row of the
table (HEALTH: ok or failed) and, where it failed, why among the row's problems, so the check fails
as the launch would."""

from __future__ import annotations

from typing import Sequence

from launcher.plan.planner import TaskPlan
from launcher.preflight.health import unhealthy_hosts
from launcher.preflight.host_report import HostReport

LOGGED_IN = ("ok", "local")  # a host's `ssh` where its check ran: the health check can run there too


def add_health_checks(reports: Sequence[HostReport], plans: Sequence[TaskPlan], command: str, ssh_backend,
                      timeout: float | None) -> None:
    """Run `command` as a launch's health check on the hosts of `plans` whose login passed, all at
    once, and write each verdict in its report; a host not reached keeps '-' (its login already
    fails it)."""
    reached = {report.host for report in reports if report.ssh in LOGGED_IN}
    unhealthy = unhealthy_hosts([plan for plan in plans if plan.host in reached], command, ssh_backend,
                                timeout=timeout)
    for report in reports:
        if report.host not in reached:
            continue
        why = unhealthy.get(report.host)
        report.health = "ok" if why is None else "failed"
        if why is not None:
            report.problems.append(why if why.startswith("the health check") else f"the health check: {why}")
