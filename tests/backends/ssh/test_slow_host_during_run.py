"""The host a synchronous job waits for, named over SSH (supervise/pace.py): two network-namespace
hosts, each with its sshd, run a PyTorch DDP job (gloo, one thread per task) whose steps keep a
core busy and print nothing. The CPU use of each task is sampled on its host by the task's join
reporter (backends/ssh/remote_command.py).

h2 is made slow through its sshd, whose sessions (and so the task) inherit its cgroup: a quota of a
third of a core (a core shared with a CPU burner is the same rule, named from the same samples:
tests/supervise/test_slow_task.py has it, on this machine). Its task is named
within minutes; and since the job prints nothing for longer than --stall-timeout while it computes,
it also shows that the stall watchdog counts the CPU use of tasks over SSH: the run is not stopped.
As in tests/supervise/test_slow_task.py, the tasks run in cgroups weighted above the rest of a
possibly loaded machine (cpu_limits.PRIORITY_WEIGHT)."""

from __future__ import annotations

import contextlib
import datetime
import json
import pathlib
import subprocess
import time

import pytest

import cpu_limits
import lab_mgpu
import needs
from launching import REPO, wait_for, wait_for_line
from ssh_helpers import PYTHON, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.slow]

PROGRAM = str(REPO / "tests" / "programs" / "torch_ddp.py")
WORK = "300"
NAMED_WITHIN = 180.0
STALL_TIMEOUT = "10"
SLOW_WINDOW = "8"  # shorter than the default (four of the supervisor's samples), so that the test takes half a minute, not three


@contextlib.contextmanager
def launched(netns, tmp_path: pathlib.Path):
    """`mgpu launch` of the DDP job on h1 and h2, its console in a file: (process, console, hold file)."""
    console = tmp_path / "console.txt"
    hold = tmp_path / "hold"
    run_id = unique_run_id("slow-host")
    with open(console, "w") as out:
        proc = lab_mgpu.start(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "h1:2222,h2:2222",
                              "--workdir", str(tmp_path), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                              "--stall-timeout", STALL_TIMEOUT, "--start-timeout", "240", "--slow-window", SLOW_WINDOW,
                              "--", PYTHON, PROGRAM, str(hold), WORK, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc, console, hold
        hold.touch()
        assert proc.wait(120) == 0, console.read_text()[-3000:]
        record = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
        assert record["attempts"][-1]["slowest"]["task"] == "worker:1"
        assert len(record["attempts"]) == 1  # never stalled, never restarted
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


def named(console: pathlib.Path, proc: subprocess.Popen, started: float) -> float:
    wait_for_line(console, "is the slowest", NAMED_WITHIN, proc)
    took = time.monotonic() - started
    lines = [line for line in console.read_text().splitlines() if "is the slowest" in line]
    assert len(lines) == 1 and lines[0].startswith("[mgpu] worker:1 on h2 is the slowest: busy "), lines
    assert "stall" not in console.read_text()
    return took


def task_started(tmp_path: pathlib.Path) -> dict[str, float]:
    """When each task of the run's last attempt started (seconds since the epoch), from run.json."""
    [record] = (tmp_path / "runs").glob("*/run.json")
    tasks = json.loads(record.read_text())["attempts"][-1]["tasks"]
    return {name: datetime.datetime.fromisoformat(task["started_at"]).timestamp() for name, task in tasks.items()}


def sshd_pid(netns, host: str) -> int:
    lab, *_ = netns
    return lab.sshds[host].proc.pid


def test_a_host_held_to_a_third_of_a_core_is_named(netns, tmp_path):
    needs.require("torch")
    with cpu_limits.cpu_weight(cpu_limits.PRIORITY_WEIGHT, "h1") as h1, \
            cpu_limits.cpu_quota(1 / 3, "h2", weight=cpu_limits.PRIORITY_WEIGHT) as h2:
        h1.add_tree(sshd_pid(netns, "h1"))
        h2.add_tree(sshd_pid(netns, "h2"))
        started = time.monotonic()
        with launched(netns, tmp_path) as (proc, console, hold):
            took = named(console, proc, started)
            # Computing silently for longer than the stall timeout is not a stall: the program prints
            # nothing until it ends, so its silence began when its tasks started.
            silent_from = max(task_started(tmp_path).values())
            wait_for(lambda: time.time() - silent_from > float(STALL_TIMEOUT) + 5 or proc.poll() is not None, 120)
            assert proc.poll() is None, console.read_text()[-3000:]
    print(f"quota over SSH: named {took:.0f} s after the launch began")
