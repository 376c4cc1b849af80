"""`mgpu launch` as the soak starts it (benchmarks/soak.py): in the foreground, the process it started,
or with --detach, the supervisor that the launch leaves behind once its run has begun (run.json's
supervisor_pid), which the launcher's faults (SIGHUP, SIGTERM) then hit. Either answers as a
subprocess.Popen does: pid, poll, wait, send_signal, kill."""

from __future__ import annotations

import json
import pathlib
import subprocess
import time

import psutil


class Launcher:
    def __init__(self, argv: list[str], env: dict, cwd: pathlib.Path, console, run_json: pathlib.Path,
                 detach: bool, timeout: float):
        self.run_json, self.detach = run_json, detach
        if detach:
            argv = [*argv[:argv.index("launch") + 1], "--detach", *argv[argv.index("launch") + 1:]]
        self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=console,
                                      stderr=subprocess.STDOUT)
        self.pid = self.popen.pid
        self.code: int | None = None
        if detach:
            self.code = self.popen.wait(timeout=timeout)  # 0 once the run has begun, else the launch's own code
            if self.code == 0:
                self.code = None
                self.pid = self._supervisor(timeout)

    def _record(self) -> dict:
        try:
            return json.loads(self.run_json.read_text())
        except (OSError, ValueError):
            return {}

    def _supervisor(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self._record().get("supervisor_pid")
            if isinstance(pid, int):
                return pid
            time.sleep(0.2)
        raise TimeoutError(f"no supervisor_pid in {self.run_json} after {timeout:g} s")

    def poll(self) -> int | None:
        if not self.detach or self.code is not None:
            return self.popen.poll() if not self.detach else self.code
        try:
            running = psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            running = False
        if running:
            return None
        code = self._record().get("exit_code")  # a detached supervisor's code, as run.json keeps it
        self.code = code if isinstance(code, int) else 1
        return self.code

    def wait(self, timeout: float) -> int:
        if not self.detach:
            return self.popen.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("mgpu launch --detach's supervisor", timeout)
            time.sleep(0.2)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            psutil.Process(self.pid).send_signal(signum) if self.detach else self.popen.send_signal(signum)

    def kill(self) -> None:
        self.send_signal(9)
