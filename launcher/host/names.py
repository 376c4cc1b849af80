"""Which host names mean this machine. Tasks on them run as local processes, without SSH."""

from __future__ import annotations

import socket

import psutil


def local_host_names() -> frozenset[str]:
    """This machine's host names and interface addresses, as literally written (no DNS lookups)."""
    names = {"localhost", socket.gethostname()}
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%", 1)[0])  # drop an IPv6 zone such as %eth0
    return frozenset(name for name in names if name)
