"""Warnings about cluster addresses reachable from the internet.

TensorFlow's gRPC server has no authentication and listens on every interface
of its host: whoever reaches a worker's port can run graph operations there.
A worker whose cluster address is public is therefore worth a warning.
"""

from __future__ import annotations

import ipaddress
from typing import Callable, Sequence

from launcher.config.addresses import is_loopback
from launcher.plan.planner import TaskPlan

# Given a host name, the address it means here, or None if unknown.
Resolver = Callable[[str], "str | None"]


def is_public(address: str) -> bool:
    """True for a global unicast address; False for private, loopback, link-local and the like."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def judged_address(host: str, resolve: Resolver | None) -> str | None:
    """The address to judge for `host`: the literal if it is one, else what `resolve` says."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return host
    except ValueError:
        pass
    if is_loopback(host):
        return None
    return resolve(host) if resolve is not None else None


def exposure_warnings(plans: Sequence[TaskPlan], resolve: Resolver | None = None) -> list[str]:
    """One warning per task of the cluster whose address is public, local tasks included.

    `resolve` turns remote host names into addresses; names that cannot be resolved, and
    names of this machine (rather than its addresses), are not judged.
    """
    warnings = []
    for plan in plans:
        if plan.port is None:  # the evaluator is not in the cluster
            continue
        address = judged_address(plan.host, None if plan.local else resolve)
        if address is None or not is_public(address):
            continue
        shown = plan.host if address == plan.host else f"{plan.host} ({address})"
        warnings.append(
            f"{plan.name} serves TensorFlow on {shown} port {plan.port}, a public address; its gRPC server "
            f"has no authentication and listens on every interface, so anyone who reaches that port can "
            f"run code there. Use private addresses or a firewall (--allow-public silences this)"
        )
    return warnings
