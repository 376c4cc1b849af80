"""The run's directory: checked before anything starts, claimed and made private when
supervision starts.

run.json and the logs may hold secrets, and a launcher running as root must not be
made to write where another user chooses. So the log dir must be the user's own (or
root's) and not open to others unless sticky; the run dir is made fresh (mkdir is the
claim on the run id: two launches with one id cannot both win it), mode 0700, and held
open: every file in it is created relative to that descriptor, never through a path,
and never through a symbolic link.

A run id tags every process of the run, and the end of a run stops every process of this
user that carries it, whatever its log dir. So a run id is also claimed on the whole machine:
a lock file per run id (flock) in a folder of this user's, RUN_ID_LOCK_DIR, held from before
the check that no live process carries the id until the run's last sweep is done. The kernel
drops it when the launcher dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import pwd
import stat

from launcher.errors import UsageError
from launcher.host import proctree
from launcher.supervise.options import SuperviseOptions

RUN_DIR_MODE = 0o700
LOG_DIR_MODE = 0o755  # explicit: under umask 000 a default mkdir would make it writable by everyone
FILE_MODE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RunDir:
    """The run's directory, held open by descriptor; files are made inside it by name. Holds the
    machine-wide claim on the run id until it is closed."""

    def __init__(self, path: pathlib.Path, fd: int, run_id: str | None = None):
        self.path = path
        self.fd = fd
        self.run_id = run_id

    def __truediv__(self, name: str) -> pathlib.Path:
        """The path of a file in the run dir, for messages (files are opened through the descriptor)."""
        return self.path / name

    def create(self, name: str, append: bool = False) -> int:
        """A new file of the run (never an existing one, never through a link), as a descriptor."""
        return os.open(name, _CREATE | (os.O_APPEND if append else 0), FILE_MODE, dir_fd=self.fd)

    def open_log(self, name: str) -> int:
        """A log to append to: made fresh by the first attempt, continued by restarts."""
        try:
            return self.create(name, append=True)
        except FileExistsError:
            return os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.run_id is not None:
            release_run_id(self.run_id)
            self.run_id = None


def run_id_lock_dir() -> str:
    """Where run id locks live: a folder of this user's that every launch of theirs finds,
    whatever its environment (root's is under /run, which only root may write)."""
    euid = os.geteuid()
    return "/run/mgpu" if euid == 0 and os.path.isdir("/run") else f"/tmp/mgpu-{euid}"


_claims: dict[str, int] = {}  # run id -> the descriptor of its locked file, in this process


def _open_lock_dir() -> int:
    """The lock folder, made if missing (mode 0700); refused unless it is this user's own and private."""
    path = run_id_lock_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e} (mgpu keeps its run id locks there)") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e} (mgpu keeps its run id locks there)") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise UsageError(f"{path}: owned by {_owner_name(st.st_uid)} or open to others; mgpu keeps its run id "
                         f"locks there: remove it")
    return fd


def claim_run_id(run_id: str) -> None:
    """Lock the run id on this machine (a second claim in this process is a no-op). Raises
    UsageError naming the launch that holds it."""
    if run_id in _claims:
        return
    name = f"{run_id}.lock"
    dir_fd = _open_lock_dir()
    try:
        for _ in range(100):  # a holder that ends removes its file: lock the one now at the name
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise UsageError(f"run id {run_id} is in use by running processes (pid {holder}: a launch on "
                                 f"this machine, in any log dir); choose another run id") from None
            try:
                current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            _claims[run_id] = fd
            return
        raise UsageError(f"run id {run_id}: its lock in {run_id_lock_dir()} keeps changing; choose another run id")
    finally:
        os.close(dir_fd)


def release_run_id(run_id: str) -> None:
    """Give the claim up. The file is removed while still locked: a launch that opened it meanwhile
    finds, once it has the lock, that the name is gone or names a new file, and starts over."""
    fd = _claims.pop(run_id, None)
    if fd is None:
        return
    try:
        os.unlink(os.path.join(run_id_lock_dir(), f"{run_id}.lock"))
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_dirs(path: pathlib.Path) -> None:
    """mkdir -p with mode LOG_DIR_MODE for every folder made (pathlib's parents get 0777 & ~umask)."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, LOG_DIR_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(folder, LOG_DIR_MODE)


def _owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_log_dir_stat(st: os.stat_result, shown: str) -> None:
    """Refuse a log dir that someone else owns, or that others may write without the sticky bit:
    they could rename the run's folder away and put one of theirs in its place."""
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--log-dir {shown}: {os.strerror(errno.ENOTDIR)}")
    if st.st_uid not in (os.geteuid(), 0):
        raise UsageError(f"--log-dir {shown}: owned by {_owner_name(st.st_uid)}, not by you; "
                         f"use a log dir of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UsageError(f"--log-dir {shown}: writable by other users without the sticky bit; "
                         f"make it private (chmod go-w) or use another")


def _open_log_dir(options: SuperviseOptions) -> int:
    log_dir = pathlib.Path(options.log_dir)
    try:
        _make_dirs(log_dir)
        fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"--log-dir {options.log_dir}: {e.strerror or e}") from None
    try:
        check_log_dir_stat(os.fstat(fd), str(options.log_dir))
        if not os.access(log_dir, os.W_OK | os.X_OK):
            raise UsageError(f"--log-dir {options.log_dir}: {os.strerror(errno.EACCES)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _already_exists(options: SuperviseOptions) -> UsageError:
    run_dir = pathlib.Path(options.log_dir) / options.run_id
    return UsageError(f"run {options.run_id} already exists in {run_dir}; choose another run id")


def check_run_dir(options: SuperviseOptions) -> pathlib.Path:
    """Check that a run can start under this run id, make the log dir, and return the
    run's directory in it (make_run_dir claims it).

    Raises UsageError, before anything starts, for a run that already exists in
    the log dir, for a run id that live processes of this user carry (every stop
    of this run would stop them too), and for a log dir that cannot be made, or
    written, or that another user could tamper with.

    The run id is claimed on the whole machine while the live processes are looked for (a
    launch that starts at the same time, in any log dir, sees the claim rather than no
    process yet); the claim is kept only if this process held it already (make_run_dir).
    """
    held = options.run_id in _claims
    claim_run_id(options.run_id)
    try:
        return _check_run_dir(options)
    finally:
        if not held:
            release_run_id(options.run_id)


def _check_run_dir(options: SuperviseOptions) -> pathlib.Path:
    fd = _open_log_dir(options)
    try:
        os.stat(options.run_id, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        raise _already_exists(options)
    finally:
        os.close(fd)
    holders = proctree.tagged_processes(options.run_id)
    if holders:
        pids = ", ".join(str(p.pid) for p in holders[:5]) + (", ..." if len(holders) > 5 else "")
        raise UsageError(
            f"run id {options.run_id} is in use by running processes (pid {pids}); choose another run id"
        )
    return pathlib.Path(options.log_dir) / options.run_id


def make_run_dir(options: SuperviseOptions) -> RunDir:
    """Claim the run id on this machine, check the run can start (check_run_dir), then claim its
    directory: made fresh, private, held open. The RunDir keeps the run id's claim until closed."""
    held = options.run_id in _claims
    claim_run_id(options.run_id)
    try:
        path = check_run_dir(options)
        log_fd = _open_log_dir(options)
        try:
            try:
                os.mkdir(options.run_id, RUN_DIR_MODE, dir_fd=log_fd)
            except FileExistsError:
                raise _already_exists(options) from None
            fd = os.open(options.run_id, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=log_fd)
            os.fchmod(fd, RUN_DIR_MODE)  # mkdir's mode is reduced by the umask
        except OSError as e:
            raise UsageError(f"--log-dir {options.log_dir}: {options.run_id}: {e.strerror or e}") from None
        finally:
            os.close(log_fd)
    except BaseException:
        if not held:
            release_run_id(options.run_id)
        raise
    return RunDir(path, fd, None if held else options.run_id)
