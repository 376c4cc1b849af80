"""Free ports for local tasks. Whether a port is free: launcher.host.probe."""

from __future__ import annotations

import contextlib
import socket



def _family(host: str) -> socket.AddressFamily:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def pick_free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports that were free on `host` a moment ago.

    Every socket stays bound until all are picked, so the kernel cannot hand out
    the same port twice. Another program may still take one before the task binds
    it; the supervisor then reports "port in use".
    """
    family = _family(host)
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports
