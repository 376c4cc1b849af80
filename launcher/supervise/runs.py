"""The runs of a log dir, as `mgpu status`, `logs`, `attach` and `stop` find them.

A run is a folder of the log dir that holds a run.json and belongs to this user (another user's runs
are neither listed nor found). Whether its supervisor still runs is not taken from run.json alone:
the pid it names must be the one that holds the run id's lock (run_lock.py), in the lock folder the
run recorded (a private folder of this user's), which the kernel releases when that process ends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import socket
import time
from typing import Any

from launcher.errors import UsageError
from launcher.supervise import run_lock, runrecord

LAST = "last"
SUPERVISOR_EXIT_TIMEOUT = 10.0  # after the lock is released, how long its process may take to exit


@dataclasses.dataclass
class Run:
    run_id: str
    path: pathlib.Path
    record: dict[str, Any]

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
        status = self.record.get("status", "?")
        if status == runrecord.RUNNING and self.here and not self.supervised():
            return runrecord.LAUNCHER_DIED
        return status

    @property
    def exit_code(self) -> int:
        """`mgpu launch`'s exit code for the run (1 when its launcher died)."""
        code = self.record.get("exit_code")
        return code if isinstance(code, int) else 1

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
    """The run in `path`, if it is this user's and its run.json can be read."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if st.st_uid != os.geteuid() or not os.path.isdir(path):
            return None
        with open(path / runrecord.NAME, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    return Run(path.name, path, record)


def runs(log_dir: pathlib.Path) -> list[Run]:
    """This user's runs in the log dir, newest first."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    found = [run for run in (load(log_dir / name) for name in names) if run is not None]
    return sorted(found, key=lambda run: (str(run.record.get("started_at") or ""), run.run_id), reverse=True)


def find(log_dir: pathlib.Path, wanted: str) -> Run:
    """The run named by a run id, a unique prefix of one, or `last`; UsageError otherwise."""
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
        shown = ", ".join(run.run_id for run in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise UsageError(f"{wanted!r} is the start of {len(matches)} runs in {log_dir} ({shown}); give more of it")
    raise UsageError(f"no run {wanted!r} of yours in {log_dir} (`mgpu status --log-dir {log_dir}` lists them)")


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


def follow(path: pathlib.Path, run: Run, out, start: int = 0, poll: float = 0.2) -> Run:
    """Copy the file at `path` to the binary stream `out` from byte `start`, as it grows, until the
    run's supervisor is gone and the file is read to its end; return the run as its record then says."""
    offset = start
    while True:
        running = run.supervised()
        if not running and run.here:
            exited(run.supervisor_pid, SUPERVISOR_EXIT_TIMEOUT)
        offset = _copy(path, out, offset)
        if not running:
            return run.reload()
        time.sleep(poll)


def _copy(path: pathlib.Path, out, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    break
                out.write(chunk)
                offset += len(chunk)
    except FileNotFoundError:
        return offset
    out.flush()
    return offset


def tail_start(path: pathlib.Path, lines: int) -> int:
    """The byte offset where the last `lines` lines of the file begin."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except FileNotFoundError:
        return 0
    cut = len(data)
    for _ in range(lines + 1):
        found = data.rfind(b"\n", 0, cut)
        if found < 0:
            return size - len(data)
        cut = found
    return size - len(data) + cut + 1
