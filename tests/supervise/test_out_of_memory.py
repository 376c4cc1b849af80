"""A task the kernel's OOM killer ends is said to be out of memory, from the kernel's count of OOM
kills in its memory cgroup; a `kill -9` from outside is not. mgpu runs in a memory cgroup of the
test's own with a limit its task exceeds (cgroup v1's memory controller, or v2's memory.max)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Iterator

import pytest

import needs
from launching import MGPU, mgpu_env, wait_for

pytestmark = pytest.mark.timeout(120)

LIMIT = 256 << 20
# Grows by 64 MB a step until the kernel ends it (at most 4 GB); says when it starts.
HUNGRY = ("import sys, time\nprint('started', flush=True)\nheld = []\n"
          "for _ in range(64):\n    held.append(bytearray(64 << 20))\n    time.sleep(0.05)\n")
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"


@contextlib.contextmanager
def memory_limited(name: str) -> Iterator[pathlib.Path]:
    """A memory cgroup limited to LIMIT bytes (no swap beyond it); its processes go back to the
    parent's group at the end and it is removed."""
    needs.root()
    v1 = pathlib.Path("/sys/fs/cgroup/memory")
    v2 = pathlib.Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        root, limits = v1, {"memory.limit_in_bytes": LIMIT}
    elif "memory" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else False:
        root, limits = v2, {"memory.max": LIMIT, "memory.swap.max": 0}
    else:
        needs.missing("needs a memory cgroup controller (v1 or v2)")
    group = root / f"mgpu-test-{os.getpid()}-{name}"
    group.mkdir()
    try:
        for file, value in limits.items():
            if (group / file).exists():
                (group / file).write_text(f"{value}\n")
        if (group / "memory.memsw.limit_in_bytes").exists():
            try:
                (group / "memory.memsw.limit_in_bytes").write_text(f"{LIMIT}\n")
            except OSError:
                pass  # no swap accounting: the limit holds all the same where there is no swap
        yield group
    finally:
        for _ in range(50):  # bounded: what is left there goes back to the root group
            pids = (group / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                try:
                    (root / "cgroup.procs").write_text(f"{pid}\n")
                except ProcessLookupError:
                    pass
        group.rmdir()


def launch_in(group: pathlib.Path, run_id: str, log_dir: pathlib.Path, program: str) -> subprocess.Popen:
    procs = str(group / "cgroup.procs")

    def join_group() -> None:  # in the child, before mgpu runs: everything it starts is in the group
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    return subprocess.Popen([*MGPU, "launch", "--local", "1", "--run-id", run_id, "--log-dir", str(log_dir),
                             "--grace-period", "1", "--", sys.executable, "-c", program],
                            env=mgpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=join_group)


def test_a_task_the_oom_killer_ends_is_said_to_be_out_of_memory(run_id, tmp_path):
    with memory_limited("oom") as group:
        proc = launch_in(group, run_id, tmp_path, HUNGRY)
        out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 1, out
    record = json.loads((tmp_path / run_id / "run.json").read_text())
    (attempt,) = record["attempts"]
    assert attempt["tasks"]["worker:0"]["signal"] == "SIGKILL", attempt
    assert attempt["cause"] == "killed" and attempt["detail"].startswith(
        "killed by the kernel's OOM killer (memory cgroup /"), attempt
    assert attempt["detail"].endswith(f"/{group.name})"), attempt


def test_a_kill_9_from_outside_is_not_called_out_of_memory(run_id, tmp_path):
    with memory_limited("kill") as group:
        proc = launch_in(group, run_id, tmp_path, SLEEPER)
        try:
            run = tmp_path / run_id / "run.json"
            wait_for(lambda: run.exists() and json.loads(run.read_text())["attempts"]
                     and json.loads(run.read_text())["attempts"][0]["tasks"].get("worker:0", {}).get("pid"), 60,
                     "the task started")
            os.kill(json.loads(run.read_text())["attempts"][0]["tasks"]["worker:0"]["pid"], signal.SIGKILL)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, out
    attempt = json.loads((tmp_path / run_id / "run.json").read_text())["attempts"][0]
    assert attempt["detail"] == ("killed by SIGKILL from outside mgpu; no out-of-memory kill in its memory cgroup "
                                 f"({attempt['detail'].split('(', 1)[1][:-1]})"), attempt
    assert attempt["detail"].endswith(f"/{group.name})"), attempt
