"""What the test folders share to run the real `mgpu` program and wait for what it does.

`MGPU` is the command line that runs this checkout's CLI; `mgpu_env()` is the environment that makes
it (and any task or remote host sharing this filesystem) import this checkout. `start_mgpu` starts
`mgpu ARGS...` and returns the process, `finish` waits for its end and output; `run_mgpu` runs it to
the end. `wait_for` polls for an event with a bounded deadline. Importable as `import launching`
(tests/conftest.py puts tests/ on sys.path).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Callable

REPO = pathlib.Path(__file__).resolve().parents[1]
MGPU = [sys.executable, "-m", "launcher"]


def mgpu_env(**extra: str) -> dict[str, str]:
    """os.environ with PYTHONPATH=REPO, then `extra` (which may replace PYTHONPATH)."""
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def start_mgpu(*args: str, cwd=None, env: dict | None = None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
               **popen) -> subprocess.Popen:
    """`mgpu ARGS...` started in text mode, by default with stderr into stdout, a pipe; `env`
    defaults to mgpu_env(). Other keywords go to subprocess.Popen."""
    return subprocess.Popen([*MGPU, *args], cwd=cwd, env=mgpu_env() if env is None else env, stdout=stdout,
                            stderr=stderr, text=popen.pop("text", True), **popen)


def run_mgpu(*args: str, cwd=None, env: dict | None = None, timeout: float = 60,
             **run) -> subprocess.CompletedProcess:
    """`mgpu ARGS...` run to the end within `timeout` seconds, stdout and stderr captured apart as
    text unless given; `env` defaults to mgpu_env(). Other keywords go to subprocess.run."""
    if "stdout" not in run and "stderr" not in run:
        run["capture_output"] = True
    return subprocess.run([*MGPU, *args], cwd=cwd, env=mgpu_env() if env is None else env, timeout=timeout,
                          text=run.pop("text", True), **run)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """(exit code, stdout) of a process started with start_mgpu's stdout pipe. Not done within
    `timeout` seconds: SIGINT, what it printed by 60 s later (then SIGKILL), and the test fails."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        raise AssertionError(f"mgpu did not finish in {timeout:g} s:\n{(out or '')[-3000:]}") from None
    return proc.returncode, out


def per_attempt(argv: list[str], option: str, first: object, later: object) -> list[str]:
    """`argv` run through sh with `option FIRST` appended in a run's first attempt (MGPU_ATTEMPT 0)
    and `option LATER` in the attempts after it: a first attempt long enough never to end before the
    test stops one of its tasks, and a restart that ends soon."""
    from launcher.protocol import ENV_ATTEMPT
    script = f'exec "$@" {option} "$(if [ "${ENV_ATTEMPT}" = 0 ]; then echo {first}; else echo {later}; fi)"'
    return ["sh", "-c", script, "sh", *argv]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` a moment ago, picked as mgpu picks its local tasks' ports."""
    from launcher.host.ports import pick_free_ports
    return pick_free_ports(1, host)[0]


def wait_for(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str] = "the condition",
             interval: float = 0.05):
    """Poll `predicate` until it returns something true, and return that; after `timeout` seconds,
    raise AssertionError naming `what` (a string, or a function called then, e.g. for a log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def wait_for_line(path: pathlib.Path, text: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until the file at `path` contains `text`; fail at once if `proc` ends first."""

    def seen() -> bool:
        if path.exists() and text in path.read_text(errors="replace"):
            return True
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{text!r} never appeared in {path.name}: the process ended first")
        return False

    wait_for(seen, timeout, what=f"{text!r} in {path.name}", interval=0.1)
