"""Free ports for local tasks. Whether a port is in use: launcher.host.ports_in_use.

Not the kernel's choice (binding port 0): that comes from the ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), where every outgoing connection of the machine
also draws its local port. A port picked there and bound by the task seconds later may
meanwhile be the local end of some connection (then the task cannot bind it), or, when a
task dials a peer's port before the peer listens, the kernel may give the dialling socket
that very port and connect it to itself. So ports are drawn at random from outside the
ephemeral range, and each is claimed (see pick_free_ports) so that concurrent launches never
pick the same one.
"""

from __future__ import annotations

import contextlib
import random
import socket
from typing import Callable, Iterable, Iterator

FIRST_UNPRIVILEGED = 1024
LAST_PORT = 65535
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default
MAX_TRIES = 2000


def _family(host: str) -> socket.AddressFamily:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (and for port 0)."""
    try:
        with open(path) as f:
            low, high = (int(n) for n in f.read().split())
        if 1 <= low <= high <= LAST_PORT:
            return low, high
    except (OSError, ValueError):
        pass
    return DEFAULT_EPHEMERAL_RANGE


def _candidates(ephemeral: tuple[int, int], count: int) -> Iterator[int]:
    """Up to `count` distinct unprivileged ports outside the ephemeral range, in random order,
    drawn one at a time as the caller asks: it mostly takes the first few, and drawing all
    `count` up front (a system random number each) would cost 3.4 ms of every launch."""
    low, high = ephemeral
    below = max(0, min(low, LAST_PORT + 1) - FIRST_UNPRIVILEGED)  # FIRST_UNPRIVILEGED .. low - 1
    above_first = max(high + 1, FIRST_UNPRIVILEGED)
    above = max(0, LAST_PORT + 1 - above_first)  # above_first .. LAST_PORT
    total = below + above
    rng = random.SystemRandom()
    if total <= 2 * count:  # few ports: all of them, shuffled
        picks: Iterable[int] = rng.sample(range(total), min(count, total))
    else:  # each draw is new with odds over one half: 8 x count draws all but surely give count
        picks = _distinct(lambda: rng.randrange(total), count, draws=8 * count)
    for i in picks:
        yield FIRST_UNPRIVILEGED + i if i < below else above_first + i - below


def _distinct(draw: Callable[[], int], count: int, draws: int) -> Iterator[int]:
    """Up to `count` distinct values of `draw()`, in the order drawn, from at most `draws` draws."""
    seen: set[int] = set()
    for _ in range(draws):
        if len(seen) == count:
            return
        value = draw()
        if value not in seen:
            seen.add(value)
            yield value


def _bind(family: socket.AddressFamily, port: int) -> socket.socket | None:
    """A socket bound to `port` on every address (no SO_REUSEADDR: a port with connections of any
    state is not taken), or None when it cannot be."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        return sock
    except OSError:
        sock.close()
        return None


def pick_free_ports(n: int, host: str = "127.0.0.1", claim: Callable[[int], bool] = lambda port: True) -> list[int]:
    """`n` distinct ports, outside the ephemeral range, that were free on this machine a moment
    ago and that `claim(port)` claimed (it returns False for a port another launch claimed; the
    claim lasts as long as the caller needs the port).

    Every socket stays bound until all are picked. Another program may still take one before the
    task binds it; the supervisor then reports "port in use". Where the ephemeral range leaves no
    port outside it, the kernel picks them (port 0).
    """
    family = _family(host)
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for port in _candidates(ephemeral_range(), MAX_TRIES):
            if len(ports) == n:
                break
            sock = _bind(family, port)
            if sock is None:
                continue
            stack.enter_context(sock)
            if claim(port):
                ports.append(port)
        while len(ports) < n:
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports
