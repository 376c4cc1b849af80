"""The soak's faults that last a while and are then undone (benchmarks/soak.py): a link slowed with
tc's netem, a full log disk (a small tmpfs under --log-dir, filled), a CPU-starved host (a CPU
cgroup's quota over every process of its namespace). Each `start_*` injects the fault and returns
what undoes it; undoing twice is harmless. Root only. Such a fault is right when the run went on
(judge_went_on)."""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess
from typing import Callable

Undo = Callable[[], None]

CGROUP_V1_CPU = pathlib.Path("/sys/fs/cgroup/cpu")
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
WENT_ON = "went on"  # what a lasting fault is charged with when no attempt ended


def _netns(namespace: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True, check=False)


def start_slow_link(namespace: str, delay_ms: int) -> Undo:
    """Every packet out of the host's eth0 delayed by `delay_ms` (each way, so a round trip by twice that)."""
    _netns(namespace, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{int(delay_ms)}ms")
    return lambda: _netns(namespace, "tc", "qdisc", "del", "dev", "eth0", "root")


def mount_small_disk(path: pathlib.Path, size_mib: int) -> Undo:
    """A tmpfs of `size_mib` MiB at `path` (made if missing); unmounted by what it returns."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size_mib)}m", "mgpu-soak", str(path)], check=True)
    return lambda: subprocess.run(["umount", "-l", str(path)], check=False)


def start_full_disk(path: pathlib.Path) -> Undo:
    """The file system of `path` filled to its last byte by one file there, removed by what it returns."""
    filler = path / ".soak-filler"
    with open(filler, "wb") as out:
        block = b"\0" * (1 << 20)
        try:
            while True:
                out.write(block)
                out.flush()
        except OSError:  # ENOSPC: full
            pass
    return lambda: filler.unlink(missing_ok=True)


def namespace_pids(namespace: str) -> list[int]:
    found = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def start_cpu_starved(namespace: str, share: float, name: str) -> Undo:
    """Every process of the host's namespace (its sshd, the tasks, what they start later: children stay
    in their parent's cgroup) held to `share` of one core by a CPU cgroup's quota; undone by lifting
    the quota, the processes moved back to the root cgroup and the cgroup removed."""
    quota = max(1000, int(share * CPU_PERIOD_US))
    v1 = CGROUP_V1_CPU.is_dir()
    group = (CGROUP_V1_CPU if v1 else CGROUP_ROOT) / name
    group.mkdir(exist_ok=True)
    if v1:
        (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (group / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
    for pid in namespace_pids(namespace):
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:  # ended meanwhile
            pass

    def undo() -> None:
        if not group.is_dir():
            return
        if v1:
            (group / "cpu.cfs_quota_us").write_text("-1")
        else:
            (group / "cpu.max").write_text(f"max {CPU_PERIOD_US}")
        parent = group.parent / "cgroup.procs"
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                parent.write_text(pid)
            except OSError:
                pass
        try:
            os.rmdir(group)
        except OSError:  # a process still there: it keeps no quota
            pass
    return undo


def epoch(text: str | None) -> float | None:
    return datetime.datetime.fromisoformat(text).timestamp() if text else None


def judge_went_on(fault, hit: dict, console_log: pathlib.Path | None) -> None:
    """Right when the attempt it hit did not end because of it (and after SIGHUP, the console went
    on in the run's console.log); for a CPU-starved host, the task named the slowest is said.
    `fault`: soak.Fault; `hit`: the attempt it hit, in run.json."""
    if hit.get("ended_at") is not None:
        fault.charged = {"cause": hit.get("cause"), "task": hit.get("task"), "host": hit.get("host")}
        fault.right = False
        return
    slowest = hit.get("slowest") or {}
    named = epoch(slowest.get("at"))
    if fault.kind == "cpu-starved" and named is not None and named >= fault.injected_at:
        fault.charged = {"cause": WENT_ON, "task": slowest.get("task"), "host": slowest.get("host")}
        fault.detected_s = round(named - fault.injected_at, 1)
    else:
        fault.charged = {"cause": WENT_ON, "task": None, "host": None}
    fault.right = True
    if fault.kind == "launcher-sighup" and console_log is not None:  # None: a detached run's, moved at its start
        try:
            fault.right = "the terminal hung up" in console_log.read_text(errors="replace")
        except OSError:
            fault.right = False
