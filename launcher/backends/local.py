"""Tasks as processes on this machine."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import time

import psutil

from launcher import protocol
from launcher.host import beside_task, proctree, py_spy
from launcher.errors import TaskFailed
from launcher.plan.planner import TaskPlan
from launcher.host.memory_cgroup import memory_cgroup
from launcher.host.ports_in_use import port_in_use
from launcher.backends.base import Attempt, Backend, CpuUsage, Strays, TaskByTask, TaskProcess
from launcher.backends.pipes import close_pipe_readers, pipe_reader


class LocalTaskProcess(TaskProcess):
    """A task process in its own session (so a terminal's Ctrl-C reaches only the launcher)."""

    def __init__(self, popen: subprocess.Popen, run_id: str | None, stdout: io.BufferedReader, stderr: io.BufferedReader,
                 launch_id: str | None = None):
        self._popen = popen
        self._run_id = run_id
        self._launch_id = launch_id
        self.pid = popen.pid
        self.stdout = stdout
        self.stderr = stderr
        try:
            # Kept from the start: psutil refuses to signal it once the pid is reused.
            self._root: psutil.Process | None = psutil.Process(popen.pid)
        except psutil.Error:
            self._root = None
        # Its memory cgroup and the OOM kills counted there so far: the evidence for a SIGKILL.
        self._memory = memory_cgroup(popen.pid)
        self._oom_kills_at_start = self._memory.oom_kills() if self._memory is not None else None

    def poll(self) -> int | None:
        return self._popen.poll()

    def out_of_memory(self) -> tuple[str, bool] | None:
        if self._memory is None or self._oom_kills_at_start is None:
            return None
        now = self._memory.oom_kills()
        return None if now is None else (self._memory.name, now > self._oom_kills_at_start)

    def signal_tree(self, signum: int) -> None:
        # The snapshot of descendants is taken before signalling, while parent links
        # still hold; it catches children that started their own session or group.
        members = []
        if self._popen.returncode is None:  # poll() runs on this thread only
            if self._root is not None and proctree.is_alive(self._root):
                members = [self._root, *proctree.descendants(self._root)]
            # The session's process group (pgid == pid): the id is ours while the leader is unreaped.
            try:
                os.killpg(self.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        elif self._run_id is not None:
            # Once the leader is reaped, the id may name another program's group:
            # only the members that carry the run id are the task's.
            members = proctree.tagged_processes(self._run_id, pgid=self.pid, launch_id=self._launch_id)
        proctree.send(members, signum)

    def dump_stacks(self) -> None:
        # The tree's processes, not also its group as signal_tree does: each gets one SIGABRT.
        if self._popen.returncode is None and self._root is not None and proctree.is_alive(self._root):
            procs = [self._root, *proctree.descendants(self._root)]
            proctree.disable_core_dumps(procs)  # SIGABRT's default action dumps core; a stack request leaves none
            proctree.send(procs, signal.SIGABRT)
            # A stopped process (SIGSTOP) takes the SIGABRT once continued: its stack is the one where it stopped.
            proctree.send(procs, signal.SIGCONT)

    def spy_stacks(self, native: bool, task: TaskPlan, timeout: float) -> py_spy.Answer | None:
        if self._popen.returncode is not None or self._root is None or not proctree.is_alive(self._root):
            return py_spy.Answer(None, problem="the task has ended")
        pids = [p.pid for p in (self._root, *proctree.descendants(self._root))]
        return py_spy.run_here(pids, native, task.argv[0] if task.argv else None, timeout, task.workdir)

    def run_beside(self, command: str, task: TaskPlan, timeout: float, limit: int) -> beside_task.Ran:
        return beside_task.run_here(command, timeout, limit, task.workdir, task.env)

    def listens_on(self, port: int) -> bool:
        return self.joined(port, None)

    def joined(self, own_port: int | None, coordinator_port: int | None) -> bool:
        if self._root is None or self._popen.returncode is not None or not proctree.is_alive(self._root):
            return False
        return proctree.joined([self._root, *proctree.descendants(self._root)], own_port, coordinator_port)

    def cpu_seconds(self) -> float | None:
        if self._root is None or self._popen.returncode is not None:
            return None
        return proctree.cpu_seconds([self._root, *proctree.descendants(self._root)])

    def stopped(self) -> bool | None:
        if self._root is None or self._popen.returncode is not None or not proctree.is_alive(self._root):
            return None
        return proctree.stopped([self._root, *proctree.descendants(self._root)])

    def usage(self) -> CpuUsage | None:
        if self._root is None or self._popen.returncode is not None or not proctree.is_alive(self._root):
            return None
        procs = [self._root, *proctree.descendants(self._root)]
        found = proctree.runnable_seconds(procs)
        if found is None:  # no schedstat (not Linux): CPU time alone, which misses waiting for a CPU
            cpu = proctree.cpu_seconds(procs)
            return CpuUsage(time.monotonic(), cpu, cpu)
        return CpuUsage(time.monotonic(), *found)

    def close(self) -> None:
        close_pipe_readers(self.stdout, self.stderr)
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class _TaggedStrays(Strays):
    """This machine's processes whose environment carries the run's id."""

    def __init__(self, procs: list[psutil.Process]):
        self._procs = procs

    def signal(self, signum: int) -> None:
        proctree.send(self._procs, signum)

    def alive(self) -> bool:
        self._procs = [p for p in self._procs if proctree.is_alive(p)]
        return bool(self._procs)


class LocalBackend(Backend):
    """Starts tasks with subprocess: argv in the plan's workdir, env = os.environ + plan.env.
    Owns the process trees of the run on this machine: its ports, its strays, its sweeps."""

    def begin_attempt(self, tasks, attempt: int) -> Attempt:
        return TaskByTask(self.start, attempt)

    def check_ports(self, tasks) -> None:
        for plan in tasks:
            if plan.port is not None and port_in_use(plan.port, plan.host):
                raise TaskFailed(f"port in use: {plan.host}:{plan.port} (planned for {plan.name})")

    def writes_here(self, task: TaskPlan) -> bool:
        return True

    def strays(self, run_id: str, launch_id: str | None = None) -> Strays:
        return _TaggedStrays(proctree.tagged_processes(run_id, launch_id=launch_id))

    def sweep(self, run_id: str, grace: float, launch_id: str | None = None) -> int:
        return proctree.stop_run(run_id, grace, launch_id=launch_id)

    def start(self, task: TaskPlan, attempt: int) -> LocalTaskProcess:
        env = dict(os.environ)
        env.update(task.env)
        env.update(protocol.attempt_env(attempt))
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            popen = subprocess.Popen(
                list(task.argv),
                cwd=task.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                start_new_session=True,
            )
        except BaseException as e:
            os.close(out_read)
            os.close(err_read)
            if isinstance(e, OSError):
                raise TaskFailed(f"{task.name}: cannot start {task.argv[0]!r}: {e.strerror or e}") from e
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        return LocalTaskProcess(popen, task.env.get(protocol.ENV_RUN_ID), pipe_reader(out_read), pipe_reader(err_read),
                                task.env.get(protocol.ENV_LAUNCH_ID))
