"""Slow hosts and tasks made real: a CPU quota from a cgroup, and a core shared with a CPU burner.

`cpu_quota(fraction)` makes a cgroup whose processes get at most `fraction` of one core (cgroup v1's
`cpu.cfs_quota_us` under /sys/fs/cgroup/cpu, or v2's `cpu.max`), and moves processes into it; every
child a process starts afterwards is in it too, so moving a host's sshd there slows every session
and task on that host. `cpu_weight(weight)` is a group without a limit that the scheduler favours
over the machine's other work: a host that gets its core however busy the machine is. `burner(core)`
keeps one core busy. All undo themselves on exit.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
from typing import Iterator

import needs

V1_ROOT = pathlib.Path("/sys/fs/cgroup/cpu")
V2_ROOT = pathlib.Path("/sys/fs/cgroup")
PERIOD_US = 100_000
# The weight of the processes under test on a loaded machine: 16 times any other process's.
PRIORITY_WEIGHT = 16


class CpuGroup:
    def __init__(self, path: pathlib.Path, v1: bool):
        self.path = path
        self._v1 = v1

    def add(self, pid: int) -> None:
        """Move process `pid` (not its running children) into the group."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def add_tree(self, pid: int) -> None:
        """Move process `pid` and every process below it, each with all its threads."""
        for member in tree(pid):
            try:
                self.add(member)
            except ProcessLookupError:
                pass  # ended meanwhile

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]


def _root() -> tuple[pathlib.Path, bool]:
    if (V1_ROOT / "cpu.cfs_quota_us").exists():
        return V1_ROOT, True
    if (V2_ROOT / "cgroup.controllers").exists() and "cpu" in (V2_ROOT / "cgroup.controllers").read_text().split():
        return V2_ROOT, False
    needs.missing("needs a cgroup CPU controller (/sys/fs/cgroup/cpu or cgroup v2 with cpu)")
    raise AssertionError("unreachable")


def cpu_quota(fraction: float, name: str = "slow", weight: int | None = None) -> contextlib.AbstractContextManager[CpuGroup]:
    """A cgroup limited to `fraction` of one core (and with `weight`, see cpu_weight). On exit its
    processes go back to the root group (those still alive) and the group is removed."""
    return _cpu_group(name, fraction, weight)


def cpu_weight(weight: int, name: str = "favoured") -> contextlib.AbstractContextManager[CpuGroup]:
    """A cgroup without a quota whose processes, when the machine is busy, get `weight` times the CPU
    of a process outside it (cgroup v1's `cpu.shares`, v2's `cpu.weight`, against the default): a
    host that keeps its own core while other work loads the machine."""
    return _cpu_group(name, None, weight)


@contextlib.contextmanager
def _cpu_group(name: str, fraction: float | None, weight: int | None) -> Iterator[CpuGroup]:
    if os.geteuid() != 0:
        needs.missing("needs root to make a cgroup")
    root, v1 = _root()
    path = root / f"mgpu-test-{os.getpid()}-{name}"
    path.mkdir()
    group = CpuGroup(path, v1)
    try:
        if fraction is not None:
            quota = max(1000, int(fraction * PERIOD_US))
            if v1:
                (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
                (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            else:
                (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        if weight is not None:  # the defaults: 1024 shares (v1), a weight of 100 (v2)
            if v1:
                (path / "cpu.shares").write_text(f"{min(262144, 1024 * weight)}\n")
            else:
                (path / "cpu.weight").write_text(f"{min(10000, 100 * weight)}\n")
        yield group
    finally:
        for _ in range(50):  # bounded: processes may start children while they are moved
            pids = group.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    (root / "cgroup.procs").write_text(f"{pid}\n")
                except ProcessLookupError:
                    pass  # gone meanwhile
        path.rmdir()


@contextlib.contextmanager
def burner(core: int) -> Iterator[subprocess.Popen]:
    """A process that keeps core `core` busy until the block ends."""
    proc = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        _wait_until_running(proc, core)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _wait_until_running(proc: subprocess.Popen, core: int, timeout: float = 30.0) -> None:
    """Until taskset has become the burner, pinned to `core`; its failure (no taskset, no such core)
    fails the test with taskset's own word."""
    import time

    import psutil
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the CPU burner on core {core} did not start: taskset exited {proc.returncode}")
        try:
            me = psutil.Process(proc.pid)
            if me.cmdline()[:1] == [sys.executable] and me.cpu_affinity() == [core]:
                return
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.01)
    raise AssertionError(f"the CPU burner on core {core} did not start within {timeout:g} s")


def tree(pid: int) -> list[int]:
    """Process `pid` and its descendants alive now."""
    import psutil
    try:
        root = psutil.Process(pid)
        return [root.pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


def pin_tree(pid: int, cores: set[int]) -> None:
    """Every thread of process `pid` and of its descendants runs only on `cores` (as `taskset -a -p`
    does); children started afterwards inherit it."""
    for member in tree(pid):
        try:
            threads = os.listdir(f"/proc/{member}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                os.sched_setaffinity(int(tid), cores)
            except ProcessLookupError:
                pass  # ended meanwhile
