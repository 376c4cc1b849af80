"""A short /bin/sh script run where a task runs, as the task would find things there: in its folder,
with the PATH it was given. What a stall collects from a task's host beyond py-spy's stacks
(nvidia-smi's state of the GPUs, the flight recorder's dumps of a remote rank) goes through it, on
this machine, over the run's SSH connection or in a step beside a Slurm task's. Standard library only.

What comes back is bounded in size and time by the caller's limits, and is read as untrusted text."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Ran:
    """A script's exit status and stdout, cut to the caller's limit; or why it did not run to its end."""
    status: int | None
    out: bytes = b""
    problem: str | None = None


def with_task_path(command: str, task_env: Mapping[str, str]) -> str:
    """`command` with the PATH the task was given, where its plan sets one (the host's own otherwise)."""
    if "PATH" not in task_env:
        return command
    return f"PATH={shlex.quote(task_env['PATH'])}; export PATH\n{command}"


def run_here(command: str, timeout: float, limit: int, workdir: str | None,
             task_env: Mapping[str, str]) -> Ran:
    """`command` on this machine, in the task's `workdir`, with the task's PATH."""
    env = dict(os.environ)
    if "PATH" in task_env:
        env["PATH"] = task_env["PATH"]
    try:
        with subprocess.Popen(["/bin/sh", "-c", command], cwd=workdir or None, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True) as proc:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.communicate()
                return Ran(None, problem=f"it did not end within {timeout:g} s")
    except OSError as exc:
        return Ran(None, problem=f"cannot run /bin/sh: {exc.strerror or exc}")
    return Ran(proc.returncode, out[:limit])
