"""The network interface each task's collectives use. Pure: the interfaces are found on the hosts
by the preflight (preflight/reach.py) and passed in.

NCCL and Gloo pick an interface on their own (the first that is up and not loopback, or the one
the host name resolves to), and on hosts with several, such as a GPU node with a management
network beside its fabric, they pick one the other hosts cannot reach, and hang or crawl. The
right one is known: the interface that holds the address the other tasks dial.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Mapping, Sequence

from launcher.plan.planner import TaskPlan

NCCL_INTERFACE = "NCCL_SOCKET_IFNAME"
GLOO_INTERFACE = "GLOO_SOCKET_IFNAME"
INTERFACE_ENV = (NCCL_INTERFACE, GLOO_INTERFACE)


def interface_env(interface: str) -> dict[str, str]:
    # NCCL reads its value as a prefix (eth1 would also match eth10); "=" asks for this name exactly.
    return {NCCL_INTERFACE: "=" + interface, GLOO_INTERFACE: interface}


def with_interfaces(plans: Sequence[TaskPlan], interfaces: Mapping[str, str | None],
                    local_environ: AbstractSet[str] = frozenset()) -> list[TaskPlan]:
    """`plans` with each task's interface (by task name) in its env, except where the user set one:
    in the plan's env (--env, an env file, --forward-env), or, for tasks on this machine, which
    inherit the launcher's environment, in `local_environ` (the names set there)."""
    added = []
    for plan in plans:
        interface = interfaces.get(plan.name)
        user_set = set(plan.env) | (set(local_environ) if plan.local else set())
        if interface is None or any(name in user_set for name in INTERFACE_ENV):
            added.append(plan)
        else:
            added.append(dataclasses.replace(plan, env=plan.env.adding(interface_env(interface))))
    return added


def with_interfaces_of(plans: Sequence[TaskPlan], before: Sequence[TaskPlan]) -> list[TaskPlan]:
    """`plans` (made again for fewer hosts) with the interfaces each host's tasks had in `before`:
    a host keeps the interface its checks found, whatever its tasks are named now."""
    found = {plan.host: {name: plan.env[name] for name in INTERFACE_ENV if name in plan.env} for plan in before}
    return [dataclasses.replace(plan, env=plan.env.adding(
        {name: value for name, value in found.get(plan.host, {}).items() if name not in plan.env}))
        if found.get(plan.host) else plan for plan in plans]
