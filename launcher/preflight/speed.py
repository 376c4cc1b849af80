"""The speed probe: how fast each host computes and sends, before the run, and which host is far
below the others.

In synchronous training every task waits for the slowest at each step, so a host with a
throttled CPU or GPU, a CPU quota, a busy neighbour or a slow link slows the whole job. On every
host of the cluster at once, the probe's speed probe (host/probe/speed_probe.py: last in the same
process and SSH session as the host check and the reachability test, preflight/check.py) sends to the next host
of a ring (in plan order) over the tasks' own addresses and ports for about 0.15 s, then
times a fixed matrix product on one core with numpy (and on the first GPU with torch or
TensorFlow, where there is one). A host whose figure is under SLOW_FRACTION of the hosts' median is named; that
judgement (`slow_hosts`) is pure.

A host's network figure is the better of its two links (the one it sends on, the one it receives
on): a slow host slows both, a slow link between two good hosts only one of theirs. With two
hosts both links are the same two hosts', so the network cannot name one of them.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from typing import Sequence, TextIO

from launcher.config.addresses import format_address
from launcher.host.probe.speed_probe import TRANSFER_SECONDS
from launcher.plan.planner import TaskPlan
from launcher.preflight.on_host import by_host
from launcher.preflight.probes import speed_args

SLOW_FRACTION = 0.7  # a figure under this fraction of the median names its host
# Seconds for the ring's connections: the hosts come to the speed probe at different times (after
# their host checks, which may import TensorFlow).
SPEED_TIMEOUT = 5.0
# What the speed probe adds to its host's session: its connections, the transfer, the compute, and
# a GPU framework's import.
SPEED_RUN_TIMEOUT = SPEED_TIMEOUT + TRANSFER_SECONDS + 60.0


@dataclasses.dataclass(frozen=True)
class HostSpeed:
    """One host's figures; None where not measured."""

    host: str
    cpu_gflops: float | None = None  # one core, numpy's float64 matrix product
    gpu_gflops: float | None = None  # the first GPU, a float32 matrix product
    send_mbps: float | None = None  # to the next host of the ring
    receive_mbps: float | None = None  # from the previous host (what that one measured)
    problems: tuple[str, ...] = ()  # what could not be measured, and why

    @property
    def network_mbps(self) -> float | None:
        links = [rate for rate in (self.send_mbps, self.receive_mbps) if rate is not None]
        return max(links) if links else None

    def as_json(self) -> dict:
        return {"cpu_gflops": _rounded(self.cpu_gflops), "gpu_gflops": _rounded(self.gpu_gflops),
                "send_mbps": _rounded(self.send_mbps), "receive_mbps": _rounded(self.receive_mbps),
                "network_mbps": _rounded(self.network_mbps), "problems": list(self.problems)}


# (name, HostSpeed attribute, unit) of each figure that is judged.
FIGURES = (("compute", "cpu_gflops", "GFLOP/s"), ("GPU", "gpu_gflops", "GFLOP/s"),
           ("network", "network_mbps", "MB/s"))


@dataclasses.dataclass(frozen=True)
class SlowFigure:
    host: str
    figure: str  # "compute", "GPU" or "network"
    value: float
    median: float
    unit: str

    def describe(self) -> str:
        return f"{self.figure} {number(self.value)} {self.unit} (median {number(self.median)})"

    def as_json(self) -> dict:
        return {"figure": self.figure, "value": _rounded(self.value), "median": _rounded(self.median),
                "unit": self.unit}


def slow_hosts(speeds: Sequence[HostSpeed], fraction: float = SLOW_FRACTION) -> list[SlowFigure]:
    """Each figure of a host under `fraction` of the median of that figure over the hosts that have
    it (two at least), in host order."""
    found = []
    for name, attr, unit in FIGURES:
        known = [(speed.host, getattr(speed, attr)) for speed in speeds if getattr(speed, attr) is not None]
        if len(known) < 2:
            continue
        median = statistics.median(value for _, value in known)
        found.extend(SlowFigure(host, name, value, median, unit) for host, value in known if value < fraction * median)
    order = {speed.host: i for i, speed in enumerate(speeds)}
    return sorted(found, key=lambda slow: order[slow.host])


def by_slow_host(slow: Sequence[SlowFigure]) -> dict[str, list[SlowFigure]]:
    named: dict[str, list[SlowFigure]] = {}
    for figure in slow:
        named.setdefault(figure.host, []).append(figure)
    return named


def describe(speed: HostSpeed) -> str:
    """The figures for a table, e.g. `cpu 9.2 GFLOP/s, net 850 MB/s`; `-` for none."""
    parts = []
    if speed.cpu_gflops is not None:
        parts.append(f"cpu {number(speed.cpu_gflops)} GFLOP/s")
    if speed.gpu_gflops is not None:
        parts.append(f"gpu {number(speed.gpu_gflops)} GFLOP/s")
    if speed.network_mbps is not None:
        parts.append(f"net {number(speed.network_mbps)} MB/s")
    return ", ".join(parts) or "-"


def warning_lines(slow: Sequence[SlowFigure]) -> list[str]:
    """One line per slow host, naming its figures against the median."""
    return [f"{host} is slow: " + ", ".join(figure.describe() for figure in figures)
            + "; in synchronous training every task waits for it"
            for host, figures in by_slow_host(slow).items()]


def number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _figure(result: dict, key: str) -> float | None:
    value = result.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def spans_hosts(plans: Sequence[TaskPlan]) -> bool:
    """Whether the cluster tasks of `plans` are on more than one host: a launch probes speeds only then."""
    return len(by_host(plan for plan in plans if plan.port is not None)) > 1


def ring_args(firsts: Sequence[TaskPlan], i: int) -> list[str]:
    """The speed probe's arguments on host `i` of `firsts` (each host's first cluster task, in plan
    order): listen on its first task port, send to the next host's first task address; on a lone
    host, the compute alone."""
    if len(firsts) == 1:
        return speed_args(None, None, SPEED_TIMEOUT)
    following = firsts[(i + 1) % len(firsts)]
    return speed_args(firsts[i].port, format_address(following.address, following.port), SPEED_TIMEOUT)


def speeds_from(firsts: Sequence[TaskPlan], results: Sequence[dict | None]) -> list[HostSpeed]:
    """Every host's figures from its speed probe's answer (None where the probe did not run), in the
    order of `firsts`; each host's receiving figure is what the previous host measured sending."""
    results = [{"error": "the speed probe did not run"} if result is None else result for result in results]
    lone = len(firsts) == 1
    speeds = []
    for i, (first, result) in enumerate(zip(firsts, results)):
        problems = [str(result[key]) for key in ("error", "send_error", "cpu_error", "gpu_error") if result.get(key)]
        previous = results[i - 1] if not lone else {}
        speeds.append(HostSpeed(first.host, _figure(result, "cpu_gflops"), _figure(result, "gpu_gflops"),
                                _figure(result, "send_mbps"), _figure(previous, "send_mbps"), tuple(problems)))
    return speeds


def warn_about_slow_hosts(speeds: Sequence[HostSpeed], console: TextIO | None = None) -> list[str]:
    """Before a launch on more than one host: print a warning line for each host far below the
    others (not a failure), and return those hosts."""
    console = console or sys.stderr
    slow = slow_hosts(speeds)
    for line in warning_lines(slow):
        console.write(f"mgpu: warning: {line}\n")
    console.flush()
    return list(by_slow_host(slow))
