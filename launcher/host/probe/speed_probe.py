"""The probe's speed probe: a transfer to the next host of a ring, then a matrix product. Part of
the probe's program (shipped as source: see __init__.py)."""

import os
import socket
import threading
import time

from launcher.host.probe.host_check import error_line
from launcher.host.probe.reach_test import REACH_RETRY, listen, split_target

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
# The BLAS of numpy is kept to one thread: the figure is one core's, comparable between hosts
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
    (the neighbour's listener may start later, and until then its port may still be taken by the
    neighbour's reachability test, which closes what it accepts)."""
    host, port = split_target(target)
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
            listener = listen(port)
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
            out["send_error"] = "%s: %s" % (target, error_line(e))
    if receiver is not None:
        receiver.join(max(0.0, deadline + TRANSFER_SECONDS + 1.0 - time.monotonic()))
        listener.close()
    try:
        out["cpu_gflops"] = cpu_gflops()
    except ImportError:
        out["cpu_error"] = "no numpy for the compute figure"
    except Exception as e:  # a broken numpy
        out["cpu_error"] = "the compute figure: %s" % error_line(e)
    if gpus:
        try:
            out["gpu_gflops"] = gpu_gflops()
        except ImportError:
            out["gpu_error"] = "no torch with CUDA, nor TensorFlow, for the GPU figure"
        except Exception as e:
            out["gpu_error"] = "the GPU figure: %s" % error_line(e)
    return out


def speed_stage(args, gpus):
    """The speed probe of PORT TARGET TIMEOUT ("-" for no port or target), timed."""
    port = None if args[0] == "-" else int(args[0])
    target = None if args[1] == "-" else args[1]
    started = time.monotonic()
    result = speed(port, target, float(args[2]), gpus)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result
