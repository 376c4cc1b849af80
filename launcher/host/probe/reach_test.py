"""The probe's reachability test: listen on this host's task ports, dial every target, and list
this host's addresses by interface. Part of the probe's program (shipped as source: see
__init__.py); the launcher's side of it is preflight/reach.py, which speaks its words (DIALED,
ALL_DIALED)."""

import errno
import os
import socket
import threading
import time

from launcher.host.interfaces import local_addresses

REACH_RETRY = 0.1  # seconds between attempts to a target that refused (its listener may not be up yet)
# How long, in TIMEOUTs, a target that refuses is tried again: the other hosts' probes may start
# that much later than this one's (many hosts, busy ones, slow login shells). An attempt that gets
# no answer at all (a firewall that drops) fails after TIMEOUT; a target that answers ends its wait.
REACH_WAIT = 4
REACH_LINGER = 3.0  # seconds a listener waits past the dialing for peers that started later
# The launcher, which hears every host, may end that wait sooner: each host says DIALED (a line on
# stdout) once its own dials are done, and when every host has, the launcher sends ALL_DIALED (a line on
# stdin) to each. A peer whose dial failed fast (a name that does not resolve there) then costs no
# wait at all. Without a launcher to say it (stdin at its end), the timers below decide alone.
DIALED = "mgpu-reach-dialed"
ALL_DIALED = "mgpu-reach-all-dialed"
# Once this host's own dials have all been answered, every host it dials has started its probe (a
# target answers only once that probe listens), and each dials this one as soon as it listens: a
# dial still missing REACH_LINGER seconds later will not come (a firewall drops it, the name does not
# resolve there), and the listeners close then, not at the end of the whole wait. Where one of this
# host's own dials failed, that host's start is unknown: it gets TIMEOUT seconds more.


def listen(port):
    """A listener on `port` of every address, both families where it can, as TensorFlow listens."""
    family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # both families, as TensorFlow listens
        except OSError:
            pass
    try:
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    except OSError:
        sock.close()
        if family != socket.AF_INET6:
            raise
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
    sock.listen(128)
    sock.settimeout(0.1)
    return sock


def _accept_until(listeners, counts, expected, stop_at, all_dialed):
    """Accept and close connections on every listener until each has its `expected`, time is up
    (stop_at[0], which the dialing may bring forward), or `all_dialed` is set."""
    while (time.monotonic() < stop_at[0] and not all_dialed.is_set()
           and any(counts[port] < expected[port] for port in listeners)):
        for port, sock in listeners.items():
            try:
                conn, _ = sock.accept()
            except (socket.timeout, BlockingIOError, InterruptedError):
                continue
            except OSError:
                continue
            conn.close()
            counts[port] += 1


def split_target(target):
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def _connect(target, timeout, deadline):
    """"ok", or why `target` could not be reached: an attempt unanswered for `timeout` seconds, or
    refused (no listener yet) until `deadline`."""
    host, port = split_target(target)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return "cannot resolve %s" % host
    family, _, _, _, address = infos[0]
    shown = address[0] if address[0] != host else ""
    reason = "timed out"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            return "ok"
        except socket.timeout:
            reason = "timed out"
            break
        except OSError as e:
            reason = (e.strerror or str(e) or errno.errorcode.get(e.errno, "error")).lower()
        finally:
            sock.close()
        time.sleep(min(REACH_RETRY, max(0.0, deadline - time.monotonic())))
    if reason == "timed out":
        reason = "timed out after %g s" % timeout
    return ("%s (%s)" % (reason, shown)) if shown else reason


def _resolved(host):
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError, IndexError):
        return None


def wait_for_all_dialed(fd, all_dialed):
    """Set `all_dialed` when an ALL_DIALED line comes on `fd`; return at its end.

    Unbuffered (os.read): a daemon thread blocked in a read of sys.stdin holds the lock of its
    buffer, and the interpreter then aborts when the probe ends first (SIGABRT, a core file where
    the host keeps them) instead of exiting."""
    pending = b""
    try:
        while True:
            data = os.read(fd, 4096)
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            if any(line.strip() == ALL_DIALED.encode() for line in lines):
                all_dialed.set()
                return
    except OSError:
        return


def reach(ports, targets, timeout, expected, all_dialed=None, on_dialed=None):
    """The reachability test (see main.py); `all_dialed`, a threading.Event, ends the
    listening when set; `on_dialed` is called once this host's own dials are done."""
    all_dialed = all_dialed if all_dialed is not None else threading.Event()
    started = time.monotonic()
    deadline = started + REACH_WAIT * timeout
    listeners, listen_errors = {}, {}
    for port in ports:
        try:
            listeners[port] = listen(port)
        except OSError as e:
            listen_errors[str(port)] = (e.strerror or str(e)).lower()
    counts = dict.fromkeys(listeners, 0)
    stop_at = [deadline + REACH_LINGER]
    acceptor = threading.Thread(target=_accept_until, args=(listeners, counts, expected, stop_at, all_dialed),
                                daemon=True)
    acceptor.start()
    results = {}

    def connect(target):
        results[target] = _connect(target, timeout, deadline)

    threads = [threading.Thread(target=connect, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + timeout + 1.0)
    if on_dialed is not None:
        on_dialed()
    answered = all(results.get(t) == "ok" for t in targets)
    stop_at[0] = min(stop_at[0], time.monotonic() + REACH_LINGER + (0.0 if answered else timeout))
    acceptor.join(max(0.0, stop_at[0] - time.monotonic()) + 1.0)
    for sock in listeners.values():
        sock.close()
    reached = {t: results.get(t, "timed out after %g s" % timeout) for t in targets}
    dialed = {t: _resolved(split_target(t)[0]) for t in targets}
    return {"listen_errors": listen_errors, "reach": reached, "dialed": dialed, "addresses": local_addresses()}
