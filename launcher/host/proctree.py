"""Finding and stopping process trees on this machine.

Every process of a run carries MGPU_RUN_ID in its environment (children inherit
it), so a scan of the process table finds them all, even grandchildren that
left their session or lost their parent.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Iterator

import psutil

from launcher import protocol

POLL_INTERVAL = 0.05


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (orphaned zombies may linger if pid 1 does not reap them)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    """Every descendant of `proc`, found through parent links (a snapshot).

    Linux lists each thread's children (/proc/PID/task/TID/children), so the walk reads the tree
    alone; psutil would read every process of the machine, each time the supervisor looks (several
    times a second a task), which on a node of thousands of processes takes a core."""
    pids = _child_pids_from_proc(proc.pid)
    if pids is None:  # no such lists (a kernel without CONFIG_PROC_CHILDREN, not Linux)
        try:
            return proc.children(recursive=True)
        except psutil.Error:
            return []
    found = []
    try:
        oldest = proc.create_time()
    except psutil.Error:
        return []
    for pid in pids:
        try:
            child = psutil.Process(pid)
            if child.create_time() >= oldest:  # not a later process that reused an ended one's id
                found.append(child)
        except psutil.Error:
            pass
    return found


def _child_pids_from_proc(root: int) -> list[int] | None:
    """The ids of `root`'s descendants from /proc's children lists; None where there are none."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return None
    found: list[int] = []
    parents = [root]
    while parents:
        parent = parents.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # ended meanwhile
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children", "rb") as f:
                    children = [int(pid) for pid in f.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            parents += children
    return found


def _tcp_sockets(proc: psutil.Process) -> list:
    try:
        return proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections("tcp")
    except psutil.Error:
        return []


def joined(procs: Iterable[psutil.Process], own_port: int | None, coordinator_port: int | None) -> bool:
    """Whether one of `procs` listens on `own_port` (a TensorFlow server; process 0 of JAX or
    PyTorch) or holds an established TCP connection to `coordinator_port` (the other processes
    of JAX and PyTorch, which dial process 0 and listen on no port of their own)."""
    for proc in procs:
        for s in _tcp_sockets(proc):
            if s.status == psutil.CONN_LISTEN and own_port is not None and s.laddr and s.laddr.port == own_port:
                return True
            if (s.status == psutil.CONN_ESTABLISHED and coordinator_port is not None and s.raddr
                    and s.raddr.port == coordinator_port):
                return True
    return False


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """User and system CPU time used by the processes of `procs` still alive."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def stopped(procs: Iterable[psutil.Process]) -> bool:
    """Whether a process of `procs` is stopped: state T in /proc/PID/stat (SIGSTOP, SIGTSTP) or t
    (held by a debugger). Such a process runs no more until continued, and its peers wait for it."""
    for proc in procs:
        try:
            if proc.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                return True
        except psutil.Error:
            continue  # gone meanwhile
    return False


def runnable_seconds(procs: Iterable[psutil.Process]) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds on a CPU or waiting for one) of every thread of `procs` still
    alive, from /proc/<pid>/task/<tid>/schedstat (Linux: its first two fields, in nanoseconds);
    None where the system has no such file."""
    on_cpu = waited = 0
    seen = False
    for proc in procs:
        try:
            threads = os.listdir(f"/proc/{proc.pid}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/schedstat", "rb") as f:
                    fields = f.read().split()
                on_cpu += int(fields[0])
                waited += int(fields[1])
                seen = True
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    if not seen:
        return None
    return on_cpu / 1e9, (on_cpu + waited) / 1e9


def every_process() -> Iterator[psutil.Process]:
    """Each process of this machine, read afresh. Not psutil.process_iter(): it keeps the processes of
    its last call by pid, and yields a pid given out again since as the program that had it then; over
    a run of days the kernel gives out every pid again, and a run's process on one would be missed."""
    for pid in psutil.pids():
        try:
            yield psutil.Process(pid)
        except psutil.Error:  # gone since the listing
            continue


def tagged_processes(run_id: str, pgid: int | None = None, launch_id: str | None = None) -> list[psutil.Process]:
    """Every live process of this user whose environment carries MGPU_RUN_ID=run_id (and, if
    `launch_id` is given, MGPU_LAUNCH_ID=launch_id or none: not another launch's with the same run
    id; a Slurm step's processes carry none) and that is in process group `pgid`, if given.

    Only this user's: anyone can put any MGPU_RUN_ID in their own processes' environment, and a
    launcher running as root must neither kill those nor let them block its run id.
    """
    found = []
    me = os.getpid()
    uid = os.getuid()
    for proc in every_process():
        if proc.pid == me:
            continue
        try:
            if proc.uids().real != uid:
                continue
            if pgid is not None and os.getpgid(proc.pid) != pgid:
                continue
            env = proc.environ()
            if (env.get(protocol.ENV_RUN_ID) == run_id
                    and (launch_id is None or env.get(protocol.ENV_LAUNCH_ID, launch_id) == launch_id)
                    and is_alive(proc)):
                found.append(proc)
        except (psutil.Error, ProcessLookupError):  # gone, zombie, or not ours to read
            continue
    return found


def send(procs: Iterable[psutil.Process], signum: int) -> None:
    """Signal each process that is still alive; psutil refuses a pid that was reused."""
    for proc in procs:
        try:
            proc.send_signal(signum)
        except psutil.Error:
            pass


def disable_core_dumps(procs: Iterable[psutil.Process]) -> None:
    """Lower each live process's core file limit (RLIMIT_CORE, soft) to 0: a signal mgpu sends to
    ask for stacks (SIGABRT) then leaves no core file, however large the process or the user's
    `ulimit -c`. Its own crashes before that still dump cores as the user chose."""
    for proc in procs:
        try:
            proc.rlimit(psutil.RLIMIT_CORE, (0, proc.rlimit(psutil.RLIMIT_CORE)[1]))
        except (psutil.Error, OSError):
            pass


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has ended or `timeout` passed; return those still alive."""
    alive = [p for p in procs if is_alive(p)]
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        alive = [p for p in alive if is_alive(p)]
    return alive


def stop_processes(procs: Iterable[psutil.Process], grace: float) -> None:
    """TERM (and CONT, so that a stopped process takes it now), wait up to `grace` seconds, then KILL
    whatever is left."""
    procs = list(procs)
    send(procs, signal.SIGTERM)
    send(procs, signal.SIGCONT)
    survivors = wait_gone(procs, grace)
    send(survivors, signal.SIGKILL)
    wait_gone(survivors, 5.0)


def stop_run(run_id: str, grace: float, rounds: int = 3, launch_id: str | None = None) -> int:
    """Stop every process tagged with `run_id` (and `launch_id`, if given); return how many were found.

    Rescans a few times, because a dying process may have just forked.
    """
    seen: set[int] = set()
    for _ in range(rounds):
        procs = tagged_processes(run_id, launch_id=launch_id)
        if not procs:
            break
        seen.update(p.pid for p in procs)
        stop_processes(procs, grace)
    return len(seen)
