"""The run's directory: checked before anything starts, made private when supervision starts."""

from __future__ import annotations

import errno
import os
import pathlib

from launcher.errors import UsageError
from launcher.host import proctree
from launcher.supervise.options import SuperviseOptions

RUN_DIR_MODE = 0o700


def check_run_dir(options: SuperviseOptions) -> pathlib.Path:
    """Check that a run can start under this run id, make the log dir, and return the
    run's directory in it (supervise() makes that one, private: run.json and the logs
    may hold secrets).

    Raises UsageError, before anything starts, for a run that already exists in
    the log dir, for a run id that live processes on this machine carry (every
    stop of this run would stop them too), and for a log dir that cannot be made
    or written.
    """
    log_dir = pathlib.Path(options.log_dir)
    run_dir = log_dir / options.run_id
    if (run_dir / "run.json").exists():
        raise UsageError(f"run {options.run_id} already exists in {run_dir}; choose another run id")
    holders = proctree.tagged_processes(options.run_id)
    if holders:
        pids = ", ".join(str(p.pid) for p in holders[:5]) + (", ..." if len(holders) > 5 else "")
        raise UsageError(
            f"run id {options.run_id} is in use by running processes (pid {pids}); choose another run id"
        )
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--log-dir {options.log_dir}: {e.strerror or e}") from None
    if not os.access(log_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--log-dir {options.log_dir}: {os.strerror(errno.EACCES)}")
    return run_dir


def make_run_dir(options: SuperviseOptions) -> pathlib.Path:
    """Check the run can start (check_run_dir) and make its private directory."""
    run_dir = check_run_dir(options)
    try:
        run_dir.mkdir(mode=RUN_DIR_MODE, exist_ok=True)
        os.chmod(run_dir, RUN_DIR_MODE)  # mkdir's mode is reduced by the umask, and the dir may exist
    except OSError as e:
        raise UsageError(f"--log-dir {options.log_dir}: {run_dir.name}: {e.strerror or e}") from None
    return run_dir
