"""Tasks as processes on this machine."""

from __future__ import annotations

import os
import subprocess

import psutil

from launcher import protocol, proctree
from launcher.errors import TaskFailed
from launcher.plan import TaskPlan
from launcher.runners.base import Runner, TaskProcess


class LocalTaskProcess(TaskProcess):
    """A task process in its own session (so a terminal's Ctrl-C reaches only the launcher)."""

    def __init__(self, popen: subprocess.Popen):
        self._popen = popen
        self.pid = popen.pid
        self.stdout = popen.stdout
        self.stderr = popen.stderr
        try:
            # Kept from the start: psutil refuses to signal it once the pid is reused.
            self._root: psutil.Process | None = psutil.Process(popen.pid)
        except psutil.Error:
            self._root = None

    def poll(self) -> int | None:
        return self._popen.poll()

    def signal_tree(self, signum: int) -> None:
        # The snapshot of descendants is taken before signalling, while parent links
        # still hold; it catches children that started their own session or group.
        members = []
        if self._popen.returncode is None and self._root is not None and proctree.is_alive(self._root):
            members = [self._root, *proctree.descendants(self._root)]
        try:
            os.killpg(self.pid, signum)  # the session's process group (pgid == pid)
        except (ProcessLookupError, PermissionError):
            pass
        proctree.send(members, signum)

    def close(self) -> None:
        # Only once both streams reached end of file: closing a stream that
        # another thread is reading would wait for that read.
        for stream in (self._popen.stdout, self._popen.stderr):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class LocalRunner(Runner):
    """Starts tasks with subprocess: argv in the plan's workdir, env = os.environ + plan.env."""

    def start(self, task: TaskPlan, attempt: int) -> LocalTaskProcess:
        env = dict(os.environ)
        env.update(task.env)
        env[protocol.ENV_ATTEMPT] = str(attempt)
        try:
            popen = subprocess.Popen(
                list(task.argv),
                cwd=task.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            raise TaskFailed(f"{task.name}: cannot start {task.argv[0]!r}: {e.strerror or e}") from e
        return LocalTaskProcess(popen)

