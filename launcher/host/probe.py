"""What a host can do for its tasks: a program that runs on the host being checked.

Standard library only and importing nothing of mgpu: `mgpu check` runs this file's source
with the task's Python on every host (over SSH for remote ones), and this machine's
launcher imports the same functions, so each question has one answer everywhere.

Run as: python probe.py PORTS MODULES [legacy-keras] [import-tensorflow], with comma-separated
lists; prints one JSON object with the keys python, busy_ports, missing_modules, tensorflow or
tensorflow_error, gpus, and with legacy-keras also tf_keras or tf_keras_error. TensorFlow's
and tf_keras's versions are read from their package metadata; with import-tensorflow (`mgpu
check`, where the tasks need it) both are imported too, which takes seconds, so that an
installation that is there but broken is found.

Or as: python probe.py reach PORTS TARGETS TIMEOUT EXPECTED, the reachability test that the
launcher runs on every host at once: listen on PORTS (this host's tasks), connect to every
TARGET (host:port, comma-separated: every task's TF_CONFIG address), an attempt failing when
unanswered for TIMEOUT seconds and a refused one tried again for REACH_WAIT x TIMEOUT, and keep
listening until each port has accepted EXPECTED connections (one per host that dials it:
comma-separated per port, or one count for all) or, once its own dials are done, REACH_HOLD
seconds more (TIMEOUT more again where one of them failed). Once its own dials are done it prints
the line DIALED; a line RELEASE on its stdin (the launcher's word that every host has dialed) ends
the listening at once: no dial is still to come. Then it prints one JSON object: listen_errors
{port: reason}, reach {target: "ok" | reason}, dialed {target: the IP address it resolved to
here}, and addresses [[address, interface], ...] of this host: from the addresses the other
hosts dialed, the launcher finds the interface of each host that NCCL and Gloo must use.

Both in one process: python probe.py reach PORTS TARGETS TIMEOUT EXPECTED check PORTS MODULES
[flags]: the reachability test, then the host check, whose JSON object it prints with the
test's under the key reach. One SSH session per host instead of two, and the test starts
before anything slow (importing TensorFlow) so that the hosts' listeners are up together.

Or as: python probe.py speed PORT TARGET TIMEOUT, the speed probe: listen on PORT (this host's
first task port) for the previous host of a ring, send to TARGET (the next host's first task
address) for about TRANSFER_SECONDS in rounds (connection attempts, and a first round that the
neighbour's reachability test's listener closed, tried again for TIMEOUT seconds: the hosts come
to it at different times), then time a fixed matrix product on one core with numpy, the best of
SPEED_WINDOWS windows of SPEED_WINDOW seconds (and on the first GPU with torch or TensorFlow,
where nvidia-smi lists one). PORT and TARGET are "-" on a lone host. Prints one JSON object:
cpu_gflops, gpu_gflops, send_mbps (null where not measured) and, for what could not be,
cpu_error, gpu_error and send_error. It may end any other mode (`reach ... check ... speed PORT
TARGET TIMEOUT`, `reach ... speed ...`): it runs last, in the same process (so the launch needs
no other SSH session for it), its answer under the key speed; numpy's threads are held to one
before the host check can import it with TensorFlow.
"""

import errno
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

REACH_RETRY = 0.1  # seconds between attempts to a target that refused (its listener may not be up yet)
# How long, in TIMEOUTs, a target that refuses is tried again: the other hosts' probes may start
# that much later than this one's (many hosts, busy ones, slow login shells). An attempt that gets
# no answer at all (a firewall that drops) fails after TIMEOUT; a target that answers ends its wait.
REACH_WAIT = 4
REACH_HOLD = 3.0  # seconds a listener waits past the dialing for peers that started later
# The launcher, which hears every host, may end that wait sooner: each host says DIALED (a line on
# stdout) once its own dials are done, and when every host has, the launcher sends RELEASE (a line on
# stdin) to each. A peer whose dial failed fast (a name that does not resolve there) then costs no
# wait at all. Without a launcher to say it (stdin at its end), the timers below decide alone.
DIALED = "mgpu-reach-dialed"
RELEASE = "release"
# Once this host's own dials have all been answered, every host it dials has started its probe (a
# target answers only once that probe listens), and each dials this one as soon as it listens: a
# dial still missing REACH_HOLD seconds later will not come (a firewall drops it, the name does not
# resolve there), and the listeners close then, not at the end of the whole wait. Where one of this
# host's own dials failed, that host's start is unknown: it gets TIMEOUT seconds more.

# A held probe's session (mgpu launch: preflight/probes.py) goes on after the probe has ended: its
# shell prints the line HELD on stdout and on stderr, then reads lines from stdin until one
# HELD_TASK=<the quoted command that starts the host's first task>, and runs that command as a
# session of its own would, in the same process. The task then needs no second SSH session, nor the
# login shell each one starts, whose start-up files (conda or pyenv init) may cost more than the
# check. Until HELD, the launcher says nothing but RELEASE on stdin.
HELD = "mgpu-probe-held"
HELD_TASK = "mgpu_task"


def port_in_use(port, host="127.0.0.1"):
    """True when a server could not listen on `port` the way TensorFlow does.

    TensorFlow binds every address with SO_REUSEADDR, so a port held only by
    connections in TIME_WAIT counts as free; a listener on any address does not.
    """
    family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((wildcard, port))
            sock.listen()
        except OSError:
            return True
    return False


def count_gpus_in_listing(text):
    """The number of GPUs in the output of `nvidia-smi -L` ("GPU 0: ... (UUID: ...)" per line)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


def gpu_count(timeout=10.0):
    """How many NVIDIA GPUs this host has; None without nvidia-smi, 0 if it fails or hangs."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "-L"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return count_gpus_in_listing(done.stdout) if done.returncode == 0 else 0


def _first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


# The names TensorFlow is installed under.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-macos",
                            "intel-tensorflow")


def _distribution_key(name):
    """A distribution's name as installers spell it in their metadata folders (PEP 503, then
    `-` as `_`): "tensorflow-cpu", "Tensorflow_CPU" and "tensorflow.cpu" are one."""
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_version(names, path=None):
    """The version of the first of `names` (distributions) installed on `path` (sys.path), from its
    metadata folder (NAME-VERSION.dist-info or .egg-info), as importlib.metadata finds it, without
    importing importlib.metadata: that import alone (email, zipfile, csv) costs a probe more than
    the rest of the host check when TensorFlow is not imported. None when none is installed."""
    folders = []
    for entry in sys.path if path is None else path:
        try:
            folders.append((entry or ".", os.listdir(entry or ".")))
        except OSError:  # not a folder (a zip), or gone
            continue
    for name in names:
        wanted = _distribution_key(name)
        for entry, listing in folders:
            for folder in listing:
                stem, _, kind = folder.rpartition(".")
                if kind not in ("dist-info", "egg-info") or _distribution_key(stem.split("-")[0]) != wanted:
                    continue
                version = _metadata_version(os.path.join(entry, folder), "METADATA" if kind == "dist-info" else "PKG-INFO")
                if version:
                    return version
    return None


def _metadata_version(folder, file_name):
    """The Version field of a metadata folder's METADATA (or PKG-INFO, or the folder itself where an
    .egg-info is one file), None if unreadable."""
    target = os.path.join(folder, file_name) if os.path.isdir(folder) else folder
    try:
        with open(target, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():  # the headers end at the first empty line
                    break
    except OSError:
        pass
    return None


NOT_INSTALLED = "not installed"  # tensorflow_error or tf_keras_error where no package metadata names the package


def installed_tensorflow_version():
    """TensorFlow's version from package metadata (without importing it), or None."""
    return installed_version(TENSORFLOW_DISTRIBUTIONS)


def probe(ports, modules, legacy_keras=False, import_tensorflow=True):
    out = {"python": "%d.%d.%d" % sys.version_info[:3]}
    out["busy_ports"] = [port for port in ports if port_in_use(port)]
    missing = []
    for name in modules:
        try:
            __import__(name)
        except Exception as e:
            missing.append("%s (%s)" % (name, _first_line(e)))
    out["missing_modules"] = missing
    if import_tensorflow:
        try:
            import tensorflow
            out["tensorflow"] = tensorflow.__version__
        except Exception as e:
            out["tensorflow_error"] = _first_line(e)
    else:
        version = installed_tensorflow_version()
        if version:
            out["tensorflow"] = version
        else:
            out["tensorflow_error"] = NOT_INSTALLED
    if legacy_keras and import_tensorflow:  # tf_keras, what `tf.keras` means with TF_USE_LEGACY_KERAS=1
        try:
            import tf_keras
            out["tf_keras"] = tf_keras.__version__
        except Exception as e:
            out["tf_keras_error"] = _first_line(e)
    elif legacy_keras:  # importing tf_keras imports TensorFlow
        version = installed_version(("tf-keras",))
        if version:
            out["tf_keras"] = version
        else:
            out["tf_keras_error"] = NOT_INSTALLED
    out["gpus"] = gpu_count(timeout=20.0)
    return out


def _listen(port):
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


def _accept_until(listeners, counts, expected, stop_at, released):
    """Accept and close connections on every listener until each has its `expected`, time is up
    (stop_at[0], which the dialing may bring forward), or `released` is set."""
    while (time.monotonic() < stop_at[0] and not released.is_set()
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


def _split_target(target):
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def _connect(target, timeout, deadline):
    """"ok", or why `target` could not be reached: an attempt unanswered for `timeout` seconds, or
    refused (no listener yet) until `deadline`."""
    host, port = _split_target(target)
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


def _addresses_from_ip_command():
    """[(address, interface)] from iproute2's one-line listing; [] without it."""
    if shutil.which("ip") is None:
        return []
    try:
        listing = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in listing.splitlines():  # "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0 ..."
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
            found.append((fields[3].split("/")[0], fields[1].split("@")[0]))
    return found


def _addresses_from_ioctl():
    """[(address, interface)] of each interface's first IPv4 address, asked of the kernel (Linux)."""
    try:
        import fcntl
        import struct
        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                answer = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address
            found.append((socket.inet_ntoa(answer[20:24]), name))
    return found


def local_addresses():
    """[(address, interface)] of this host: every address with iproute2, else each interface's
    first IPv4 address."""
    return _addresses_from_ip_command() or _addresses_from_ioctl()


def interface_holding(ips, addresses):
    """The interface, from [(address, interface)], that holds one of `ips` (tried in order); None
    when none does (a NAT address, say)."""
    held = {}
    for address, name in addresses:
        try:
            held.setdefault(ipaddress.ip_address(address.split("%")[0]), name)
        except ValueError:
            continue
    for value in ips:
        try:
            wanted = ipaddress.ip_address(value.split("%")[0])
        except ValueError:
            continue
        if wanted in held:
            return held[wanted]
        if wanted.is_loopback:  # all of 127.0.0.0/8 is the loopback interface's, listed or not
            loopback = [name for address, name in held.items() if address.is_loopback and address.version == wanted.version]
            if loopback:
                return loopback[0]
    return None


def source_address_toward(host):
    """The address this host sends from to reach `host` (the kernel's route; no packet is sent);
    None when `host` does not resolve or is not routed."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            return sock.getsockname()[0]
    except (OSError, UnicodeError, IndexError):
        return None


def interface_toward(hosts, own):
    """The interface this host sends from to reach the first of `hosts` that is not `own` (`own`
    itself when all are: not the address this host resolves its own name to, which on Debian is
    127.0.1.1); None when that host does not resolve or is not routed, or no interface holds the
    address."""
    peer = next((host for host in hosts if host != own), own)
    source = source_address_toward(peer)
    return interface_holding([source], local_addresses()) if source else None


def _resolved(host):
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (OSError, UnicodeError, IndexError):
        return None


def _wait_for_release(fd, released):
    """Set `released` when a RELEASE line comes on `fd`; return at its end.

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
            if any(line.strip() == RELEASE.encode() for line in lines):
                released.set()
                return
    except OSError:
        return


def reach(ports, targets, timeout, expected, released=None, on_dialed=None):
    """The reachability test (see the module docstring); `released`, a threading.Event, ends the
    listening when set; `on_dialed` is called once this host's own dials are done."""
    released = released if released is not None else threading.Event()
    started = time.monotonic()
    deadline = started + REACH_WAIT * timeout
    listeners, listen_errors = {}, {}
    for port in ports:
        try:
            listeners[port] = _listen(port)
        except OSError as e:
            listen_errors[str(port)] = (e.strerror or str(e)).lower()
    counts = dict.fromkeys(listeners, 0)
    stop_at = [deadline + REACH_HOLD]
    acceptor = threading.Thread(target=_accept_until, args=(listeners, counts, expected, stop_at, released),
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
    stop_at[0] = min(stop_at[0], time.monotonic() + REACH_HOLD + (0.0 if answered else timeout))
    acceptor.join(max(0.0, stop_at[0] - time.monotonic()) + 1.0)
    for sock in listeners.values():
        sock.close()
    reached = {t: results.get(t, "timed out after %g s" % timeout) for t in targets}
    dialed = {t: _resolved(_split_target(t)[0]) for t in targets}
    return {"listen_errors": listen_errors, "reach": reached, "dialed": dialed, "addresses": local_addresses()}


# The speed probe. A compute figure is the best of SPEED_WINDOWS windows of SPEED_WINDOW seconds
# each: a window spans more than one period of a CFS CPU quota (100 ms), so a quota shows, while
# the better window forgives a moment's noise. Short, because every host spends them before its
# tasks start (where hosts share cores, as in a test bed, their sum is what the launch waits for).
SPEED_WINDOW = 0.11
SPEED_WINDOWS = 2
SPEED_MATRIX = 256  # n of the n x n float64 product on the CPU
GPU_MATRIX = 4096  # n of the n x n float32 product on the GPU
TRANSFER_SECONDS = 0.15  # about how long a host sends to the next one (the rounds after the first fill it)
TRANSFER_ROUNDS = 4  # in rounds: the first of TRANSFER_FIRST_ROUND bytes, the others sized from the best so far
TRANSFER_FIRST_ROUND = 4 << 20
TRANSFER_MAX_BYTES = 256 << 20  # the most one round sends
TRANSFER_CHUNK = 1 << 20
# The BLAS of numpy is held to one thread: the figure is one core's, comparable between hosts
# whatever their core counts and however busy their other cores are.
ONE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                  "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def best_rate(step, work, window=SPEED_WINDOW, windows=SPEED_WINDOWS, clock=time.perf_counter):
    """The best of `windows` rates (`work` units per second) of calling `step` for `window` seconds."""
    best = 0.0
    for _ in range(windows):
        count = 0
        started = clock()
        while True:
            step()
            count += 1
            elapsed = clock() - started
            if elapsed >= window:
                break
        best = max(best, count * work / elapsed)
    return best


def cpu_gflops(n=SPEED_MATRIX):
    """GFLOP/s of an n x n float64 matrix product with numpy (on one core when main() runs it)."""
    import numpy
    rng = numpy.random.default_rng(0)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    a @ b  # the first product loads the BLAS
    return best_rate(lambda: a @ b, 2.0 * n ** 3) / 1e9


def gpu_gflops(n=GPU_MATRIX):
    """GFLOP/s of an n x n float32 matrix product on the first GPU, with torch or else TensorFlow."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")

        def step():
            a @ b
            torch.cuda.synchronize()
        step()
        return best_rate(step, 2.0 * n ** 3) / 1e9
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    if not tf.config.list_physical_devices("GPU"):
        raise RuntimeError("no GPU for torch or TensorFlow")
    with tf.device("/GPU:0"):
        a = tf.random.normal((n, n))
        b = tf.random.normal((n, n))

        def step():
            (a @ b).numpy()[0, 0]  # .numpy() waits for the product
        step()
        return best_rate(step, 2.0 * n ** 3) / 1e9


def _read_exactly(conn, size):
    """`size` bytes from `conn` (fewer only at its end)."""
    parts, left = [], size
    while left > 0:
        data = conn.recv(min(left, TRANSFER_CHUNK))
        if not data:
            break
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def _receive_one(listener, deadline, outcome):
    """Accept one connection by `deadline` and serve its rounds: each is an 8-byte length and that
    many bytes, answered with one byte once all have arrived (the sender's clock stops then)."""
    while time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except (socket.timeout, BlockingIOError, InterruptedError):
            continue
        except OSError:
            return
        with conn:
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            total = 0
            try:
                while True:
                    header = _read_exactly(conn, 8)
                    if len(header) < 8:
                        break
                    size = int.from_bytes(header, "big")
                    left = size
                    while left > 0:
                        data = conn.recv(min(left, TRANSFER_CHUNK))
                        if not data:
                            break
                        left -= len(data)
                    total += size - left
                    if left:
                        break
                    conn.sendall(b"k")
            except OSError:
                pass
            if total == 0:
                continue  # a connection that sent nothing is not the neighbour's transfer
            outcome["received_bytes"] = total
            return


class _NotTheReceiver(OSError):
    """The connection closed before the first round was confirmed: what answered was not (yet) the
    neighbour's receiver (its reachability test's listener, say, which closes what it accepts)."""


def _connect_until(address, family, deadline):
    """A connection to `address`, tried again while refused until `deadline` (the neighbour's
    listener may start later)."""
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock.connect(address)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() + REACH_RETRY >= deadline:
                raise
            time.sleep(REACH_RETRY)


def _send_rounds(sock, deadline, seconds, rounds, max_bytes):
    """The best rate in bytes per second of `rounds` rounds sent on `sock` (see send_to)."""
    chunk = memoryview(bytes(TRANSFER_CHUNK))
    best = 0.0
    size = TRANSFER_FIRST_ROUND
    sock.settimeout(max(1.0, deadline - time.monotonic()) + seconds)
    for done in range(rounds):
        started = time.perf_counter()
        try:
            sock.sendall(size.to_bytes(8, "big"))
            left = size
            while left > 0:
                sock.sendall(chunk[:min(left, TRANSFER_CHUNK)])
                left -= min(left, TRANSFER_CHUNK)
            answer = sock.recv(1)
        except (ConnectionResetError, BrokenPipeError) as e:
            if done == 0:
                raise _NotTheReceiver(e.errno, e.strerror) from e
            raise
        if answer != b"k":
            if done == 0:
                raise _NotTheReceiver("the receiver did not confirm")
            raise OSError("the receiver did not confirm")
        elapsed = time.perf_counter() - started
        best = max(best, size / elapsed)
        # The next round sized to take its share of `seconds` at the best rate so far.
        size = int(min(max_bytes, max(TRANSFER_FIRST_ROUND, best * seconds / rounds)))
    sock.shutdown(socket.SHUT_WR)
    return best


def send_to(target, deadline, seconds=TRANSFER_SECONDS, rounds=TRANSFER_ROUNDS, max_bytes=TRANSFER_MAX_BYTES):
    """MB/s of sending to `target` (host:port): the best of `rounds` rounds that each take about
    seconds/rounds, each counted until the receiver has read it all (the best round forgives a
    moment's noise, as the compute's best window does); connection attempts go on until `deadline`
    (the neighbour's listener may start later, and until then its port may still be held by the
    neighbour's reachability test, which closes what it accepts)."""
    host, port = _split_target(target)
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    while True:
        with _connect_until(address, family, deadline) as sock:
            try:
                return _send_rounds(sock, deadline, seconds, rounds, max_bytes) / 1e6
            except _NotTheReceiver:
                if time.monotonic() + REACH_RETRY >= deadline:
                    raise
        time.sleep(REACH_RETRY)


def speed(port, target, timeout, gpus=None):
    """This host's figures: the transfer to the next host of the ring (while the previous one sends
    here), then the compute."""
    out = {"cpu_gflops": None, "gpu_gflops": None, "send_mbps": None}
    deadline = time.monotonic() + timeout
    receiver = None
    outcome = {}
    if port is not None:
        try:
            listener = _listen(port)
        except OSError as e:
            out["send_error"] = "cannot listen on port %d: %s" % (port, (e.strerror or str(e)).lower())
            listener = None
        if listener is not None:
            receiver = threading.Thread(target=_receive_one, args=(listener, deadline + TRANSFER_SECONDS, outcome),
                                        daemon=True)
            receiver.start()
    if target is not None:
        try:
            out["send_mbps"] = send_to(target, deadline)
        except OSError as e:
            out["send_error"] = "%s: %s" % (target, (e.strerror or str(e) or type(e).__name__).lower())
        except (UnicodeError, IndexError) as e:  # a name that does not resolve
            out["send_error"] = "%s: %s" % (target, _first_line(e))
    if receiver is not None:
        receiver.join(max(0.0, deadline + TRANSFER_SECONDS + 1.0 - time.monotonic()))
        listener.close()
    try:
        out["cpu_gflops"] = cpu_gflops()
    except ImportError:
        out["cpu_error"] = "no numpy for the compute figure"
    except Exception as e:  # a broken numpy
        out["cpu_error"] = "the compute figure: %s" % _first_line(e)
    if gpus:
        try:
            out["gpu_gflops"] = gpu_gflops()
        except ImportError:
            out["gpu_error"] = "no torch with CUDA, nor TensorFlow, for the GPU figure"
        except Exception as e:
            out["gpu_error"] = "the GPU figure: %s" % _first_line(e)
    return out


def _host_check(args):
    """The host check of PORTS MODULES [flags]."""
    ports = [int(port) for port in args[0].split(",") if port]
    modules = [name for name in args[1].split(",") if name]
    flags = args[2:]
    return probe(ports, modules, legacy_keras="legacy-keras" in flags, import_tensorflow="import-tensorflow" in flags)


def _speed_stage(args, gpus):
    """The speed probe of PORT TARGET TIMEOUT ("-" for no port or target), timed."""
    port = None if args[0] == "-" else int(args[0])
    target = None if args[1] == "-" else args[1]
    started = time.monotonic()
    result = speed(port, target, float(args[2]), gpus)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def main(argv):
    args = argv[1:]
    speed_args = None
    if len(args) >= 4 and args[-4] == "speed":  # always last, with its three arguments
        args, speed_args = args[:-4], args[-3:]
        for name in ONE_THREAD_ENV:  # before anything imports numpy (TensorFlow, in the host check)
            os.environ[name] = "1"
    if args[:1] == ["reach"]:
        ports = [int(port) for port in args[1].split(",") if port]
        targets = [target for target in args[2].split(",") if target]
        counts = [int(count) for count in args[4].split(",")]  # per port, or one for every port
        released = threading.Event()
        threading.Thread(target=_wait_for_release, args=(0, released), daemon=True).start()
        reached = reach(ports, targets, float(args[3]), dict(zip(ports, counts * len(ports) if len(counts) == 1 else counts)),
                        released, lambda: print(DIALED, flush=True))
        if args[5:6] == ["check"]:
            result = _host_check(args[6:])
            result["reach"] = reached
        else:
            result = reached
    elif args:
        result = _host_check(args)
    else:
        result = None
    if speed_args is not None:
        gpus = result.get("gpus") if result is not None and "gpus" in result else gpu_count(timeout=10.0)
        measured = _speed_stage(speed_args, gpus)
        if result is None:
            result = measured
        else:
            result["speed"] = measured
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
