"""The runs of a log dir, as `mgpu status`, `logs`, `attach` and `stop` find them.

A run is a folder of the log dir that holds a run.json and belongs to this user (another user's runs
are neither listed nor found); it is read as run_files.py allows, and one that is not (its folder
open to others, its record not shaped as a launch writes it) is listed as unreadable, with the
reason; it sorts last, with no start time. Whether its supervisor still runs is not taken from
run.json alone: the pid it names must be the one that holds the run id's lock (run_lock.py), in
the lock folder the run recorded (a private folder of this user's), which the kernel releases when
that process ends.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import socket
import time
from typing import Any

from launcher.config.addresses import parse_run_id
from launcher.errors import UsageError
from launcher.supervise import run_files, run_lock, runrecord
from launcher.supervise.console_text import console_safe

LAST = "last"
UNREADABLE = "unreadable"
SUPERVISOR_EXIT_TIMEOUT = 10.0  # after the lock is released, how long its process may take to exit


@dataclasses.dataclass
class Run:
    run_id: str
    path: pathlib.Path
    record: dict[str, Any]
    problem: str | None = None  # why the run cannot be read (then its record is empty)

    @property
    def supervisor_pid(self) -> int | None:
        pid = self.record.get("supervisor_pid")
        return pid if isinstance(pid, int) and pid > 0 else None

    @property
    def here(self) -> bool:
        """Whether it is supervised from this machine (a log dir may be shared with others)."""
        return self.record.get("supervisor_host") in (None, socket.gethostname())

    def supervised(self) -> bool:
        """Whether its supervisor runs: on this machine, the process that holds the run id's lock is
        the one run.json names; on another, as far as run.json says."""
        if not self.here:
            return self.reload().record.get("status") == runrecord.RUNNING
        pid = self.supervisor_pid
        return pid is not None and run_lock.holder(self.run_id, self.lock_dir) == pid

    @property
    def lock_dir(self) -> str | None:
        """The folder of the run id's lock, as the run recorded it (whatever this shell's environment
        says); run_lock.holder believes it only if it is this user's own private folder."""
        folder = self.record.get("lock_dir")
        return folder if isinstance(folder, str) and os.path.isabs(folder) and len(folder) < 4096 else None

    def reload(self) -> "Run":
        return load(self.path) or self

    @property
    def state(self) -> str:
        """run.json's status; a run recorded as running whose supervisor is gone: launcher-died."""
        if self.problem is not None:
            return UNREADABLE
        status = self.record.get("status", "?")
        if status == runrecord.RUNNING and self.here and not self.supervised():
            return runrecord.LAUNCHER_DIED
        return status

    @property
    def exit_code(self) -> int:
        """`mgpu launch`'s exit code for the run (1 when its launcher died)."""
        code = self.record.get("exit_code")
        return code if isinstance(code, int) and 0 <= code <= 255 else 1

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return self.record.get("attempts") or []

    @property
    def tasks(self) -> dict[str, dict[str, Any]]:
        """The tasks of the latest attempt, by name."""
        return self.attempts[-1].get("tasks", {}) if self.attempts else {}

    def task_names(self) -> list[str]:
        names = [f"{plan.get('type')}:{plan.get('index')}" for plan in self.record.get("plans", [])]
        return names or list(self.tasks)

    def file(self, name: str) -> pathlib.Path:
        return self.path / name


def load(path: pathlib.Path) -> Run | None:
    """The run in `path`, if it is a folder of this user's with a run.json; unreadable (with its
    problem) if the folder or the record is not as a launch makes them."""
    try:
        folder = run_files.open_folder(path)
    except FileNotFoundError:
        return None
    except run_files.NotYours:
        return None
    except run_files.Unreadable as e:
        return _unreadable(path, str(e)) if _has_record(path) else None
    try:
        record = run_files.read_record(folder)
        if record.get("status") == runrecord.RUNNING:  # or ended where run.json could not take it (a full disk)
            record = {**record, **(run_files.read_end(folder) or {})}
    except FileNotFoundError:
        return None
    except (run_files.Unreadable, OSError) as e:
        return _unreadable(path, str(e) if isinstance(e, run_files.Unreadable) else e.strerror or str(e))
    finally:
        os.close(folder)
    return Run(path.name, path, record)


def _has_record(path: pathlib.Path) -> bool:
    return os.path.lexists(path / runrecord.NAME)


def _unreadable(path: pathlib.Path, problem: str) -> Run:
    return Run(path.name, path, {}, problem=problem)


def runs(log_dir: pathlib.Path) -> list[Run]:
    """This user's runs in the log dir, newest first."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    found = [run for run in (load(log_dir / name) for name in names) if run is not None]
    return sorted(found, key=lambda run: (str(run.record.get("started_at") or ""), run.run_id), reverse=True)


def find(log_dir: pathlib.Path, wanted: str) -> Run:
    """The run named by a run id, a unique prefix of one, or `last`; UsageError otherwise, and for
    a run that cannot be read."""
    run = _find(log_dir, wanted)
    if run.problem is not None:
        raise UsageError(f"run {console_safe(run.run_id)} cannot be read: {console_safe(run.problem)}")
    return run


def _find(log_dir: pathlib.Path, wanted: str) -> Run:
    every = runs(log_dir)
    if wanted == LAST:
        if not every:
            raise UsageError(f"no runs in {log_dir}")
        return every[0]
    exact = [run for run in every if run.run_id == wanted]
    if exact:
        return exact[0]
    matches = [run for run in every if run.run_id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(console_safe(run.run_id) for run in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise UsageError(f"{console_safe(repr(wanted))} is the start of {len(matches)} runs in {log_dir} ({shown}); "
                         f"give more of it")
    raise UsageError(f"no run {console_safe(repr(wanted))} of yours in {log_dir} "
                     f"(`mgpu status --log-dir {log_dir}` lists them)")


def lock_holder(wanted: str) -> int | None:
    """The supervisor that holds the lock of run id `wanted` on this machine (in any folder a launch
    of this user may have used), whatever log dir its run is in, or whether its folder is still
    there; None when `wanted` is not a run id or no launch holds it."""
    try:
        run_id = parse_run_id(wanted)
    except ValueError:
        return None
    pid = run_lock.holder(run_id)
    return pid if pid is not None and pid > 1 and pid != os.getpid() else None


def wait_until_released(run_id: str, pid: int, timeout: float, poll: float = 0.2) -> bool:
    """Wait (bounded) until process `pid` no longer holds the run id's lock, then until it has
    ended; whether it did."""
    deadline = time.monotonic() + timeout
    while run_lock.holder(run_id) == pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return exited(pid, SUPERVISOR_EXIT_TIMEOUT, poll)


def wait_until_ended(run: Run, poll: float = 0.2, timeout: float | None = None) -> Run:
    """Wait until the run's supervisor is gone (its lock released, then its process ended, so that its
    last line is written), and return the run as its record then says."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while run.supervised():
        if deadline is not None and time.monotonic() > deadline:
            return run.reload()
        time.sleep(poll)
    if run.here:
        exited(run.supervisor_pid, SUPERVISOR_EXIT_TIMEOUT, poll)
    return run.reload()


def exited(pid: int | None, timeout: float, poll: float = 0.1) -> bool:
    """Wait (bounded) until process `pid` has ended."""
    deadline = time.monotonic() + timeout
    while pid is not None and _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child of ours that ended but was not reaped is gone too
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def open_log(run: Run, name: str) -> int | None:
    """A file of the run's folder, for reading (run_files.open_run_file); None while it is not
    there. UsageError for one that may not be read."""
    try:
        return run_files.open_run_file(run.path, name)
    except FileNotFoundError:
        return None
    except run_files.Unreadable as e:
        raise UsageError(f"run {console_safe(run.run_id)}: {console_safe(str(e))}") from None


def follow(name: str, run: Run, out, start: int = 0, poll: float = 0.2) -> Run:
    """Copy the run's file `name` to the binary stream `out` from byte `start`, as it grows, until
    the run's supervisor is gone and the file is read to its end; return the run as its record then
    says. The file is opened once it is there, and read through that descriptor from then on."""
    offset = start
    fd = None
    try:
        while True:
            running = run.supervised()
            if not running and run.here:
                exited(run.supervisor_pid, SUPERVISOR_EXIT_TIMEOUT)
            if fd is None:
                fd = open_log(run, name)
            if fd is not None:
                offset = copy(fd, out, offset)
            if not running:
                return run.reload()
            time.sleep(poll)
    finally:
        if fd is not None:
            os.close(fd)


def copy(fd: int, out, offset: int = 0) -> int:
    """Copy the file `fd` to `out` from `offset` to where it ends now (not to what a task goes on
    adding: that is for the next call); the offset reached."""
    end = os.fstat(fd).st_size
    while offset < end and (chunk := os.pread(fd, min(1 << 16, end - offset), offset)):
        out.write(chunk)
        offset += len(chunk)
    out.flush()
    return offset


def tail_start(fd: int, lines: int) -> int:
    """The byte offset where the last `lines` lines of the file `fd` begin."""
    size = os.fstat(fd).st_size
    start = max(0, size - 256 * 1024)
    data = os.pread(fd, size - start, start)
    cut = len(data)
    for _ in range(lines + 1):
        found = data.rfind(b"\n", 0, cut)
        if found < 0:
            return start
        cut = found
    return start + cut + 1
