"""The run's directory: checked before anything starts, claimed and made private when
supervision starts.

run.json and the logs may hold secrets, and a launcher running as root must not be
made to write where another user chooses. So the log dir must be the user's own (or
root's) and not open to others unless sticky; the run dir is made fresh (mkdir is the
claim on the run id: two launches with one id cannot both win it), mode 0700, and held
open: every file in it is created relative to that descriptor, never through a path,
and never through a symbolic link.

The run dir is made under the machine-wide claim on the run id (run_lock.py), and holds that
claim until it is closed.
"""

from __future__ import annotations

import errno
import os
import pathlib
import stat

from launcher.errors import UsageError
from launcher.supervise import run_lock
from launcher.supervise.options import SuperviseOptions

CONSOLE_LOG = "console.log"  # a detached run's console, and the rest of a run's whose terminal hung up
CHECKS = "checks.json"  # the host checks' table of the launch (fleet/checks_file.py), for `mgpu report`
MAX_CHECKS_BYTES = 1 << 20  # of checks.json: its writer cuts it to this, its reader takes no more
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
            run_lock.release_run_id(self.run_id)
            self.run_id = None


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


def check_log_dir_stat(st: os.stat_result, shown: str) -> None:
    """Refuse a log dir that someone else owns, or that others may write without the sticky bit:
    they could rename the run's folder away and put one of theirs in its place."""
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--log-dir {shown}: {os.strerror(errno.ENOTDIR)}")
    if st.st_uid not in (os.geteuid(), 0):
        raise UsageError(f"--log-dir {shown}: owned by {run_lock.owner_name(st.st_uid)}, not by you; "
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

    Raises UsageError, before anything starts, for a run that already exists in the log dir,
    and for a log dir that cannot be made, or written, or that another user could tamper with.
    """
    fd = _open_log_dir(options)
    try:
        os.stat(options.run_id, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        raise _already_exists(options)
    finally:
        os.close(fd)
    return pathlib.Path(options.log_dir) / options.run_id


def make_run_dir(options: SuperviseOptions) -> RunDir:
    """Claim the run id on this machine (unless this process holds it already), check the run can
    start (check_run_dir), then claim its directory: made fresh, private, held open. The RunDir
    keeps a claim it made until closed."""
    held = run_lock.is_claimed(options.run_id)
    run_lock.claim_run_id(options.run_id)
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
            run_lock.release_run_id(options.run_id)
        raise
    return RunDir(path, fd, None if held else options.run_id)
