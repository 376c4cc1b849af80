"""Free ports for local tasks, and recognising a task that could not bind its port."""

from __future__ import annotations

import contextlib
import re
import socket

# What TensorFlow's gRPC server prints when its port is taken (TF 2.21), and the
# classic wording of older releases and other servers.
_NO_ADDRESS = re.compile(r"No address added out of total \d+ resolved for '[^']*?:(\d+)'")
_BIND_FAILURE = re.compile(r"Address already in use|Failed to bind|Could not start gRPC server")


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


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could not listen on `port` the way TensorFlow does.

    TensorFlow binds every address with SO_REUSEADDR, so a port held only by
    connections in TIME_WAIT counts as free; a listener on any address does not.
    """
    family = _family(host)
    wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((wildcard, port))
            sock.listen()
        except OSError:
            return True
    return False


def bind_failure(line: str) -> int | None:
    """The port a line of task output says could not be bound: its number, or 0
    when the line reports a bind failure without naming the port; None otherwise."""
    match = _NO_ADDRESS.search(line)
    if match:
        return int(match.group(1))
    if _BIND_FAILURE.search(line):
        return 0
    return None
