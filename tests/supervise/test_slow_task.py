"""The task a synchronous job waits for, named while it runs (supervise/pace.py).

With real slow tasks on this machine: a PyTorch DDP job (gloo, one thread per task) whose steps keep
a core busy. Both tasks run on one core, so that whatever else loads the machine slows them alike:
the imbalance the product must see is only the one the test makes. First the cluster is even: no
task is named for a whole window and more, and run.json carries every task's busy share. Then
worker:1 is held to a quarter of a core by a cgroup quota: it is named. Then the quota is lifted and
worker:0 shares its time with a CPU burner (of a higher priority than worker:0 in their group)
while worker:1 has a group of its own: worker:0 is named.

The tasks (and the burner) run in cgroups weighted well above the rest of the machine
(cpu_limits.PRIORITY_WEIGHT): other work on a loaded machine would otherwise take the core from
them, and the held task's peer would have to wait for the core as long as for the held task.

And from the tasks' own time splits (MGPU_TIME_SPLIT lines), where CPU samples see nothing."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

import cpu_limits
import needs
from launching import REPO, start_mgpu, wait_for, wait_for_line
from launcher.supervise import pace

pytestmark = pytest.mark.slow

PROGRAM = str(REPO / "tests" / "programs" / "torch_ddp.py")
WORK = "300"  # matrix products a step: some tens of milliseconds of one core
NAMED_WITHIN = 180.0  # seconds from the start of an imbalance
WINDOW = 8.0  # --slow-window: shorter than the default (four of the supervisor's samples), so that the test takes half a minute, not three


def record(runs: pathlib.Path, run_id: str) -> dict:
    try:
        return json.loads((runs / run_id / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def tasks(runs: pathlib.Path, run_id: str) -> dict:
    attempts = record(runs, run_id).get("attempts") or [{}]
    return attempts[-1].get("tasks", {})


def busy(runs: pathlib.Path, run_id: str) -> dict[str, float] | None:
    shares = {name: (task.get("busy") or {}).get("share") for name, task in tasks(runs, run_id).items()}
    return shares if shares and None not in shares.values() else None


def started_pids(runs: pathlib.Path, run_id: str) -> dict[str, int] | None:
    """Each task's pid, once both have one."""
    pids = {name: task.get("pid") for name, task in tasks(runs, run_id).items()}
    return pids if len(pids) == 2 and all(pids.values()) else None


def slowest_lines(console: pathlib.Path) -> list[str]:
    return [line for line in console.read_text(errors="replace").splitlines() if "is the slowest" in line]


def phases(proc, runs: pathlib.Path, run_id: str, console: pathlib.Path, pids: dict[str, int],
           first: cpu_limits.CpuGroup, core: int) -> tuple[dict, float, dict, float]:
    measured = time.monotonic()
    # Even: a whole window and more without a name.
    wait_for(lambda: time.monotonic() - measured > WINDOW + 3 * pace.SAMPLE_INTERVAL or proc.poll() is not None,
             WINDOW + 60)
    assert proc.poll() is None
    assert slowest_lines(console) == [], busy(runs, run_id)
    even = busy(runs, run_id)

    # worker:1 held to a quarter of a core, on the core worker:0 has for itself the rest of the time.
    with cpu_limits.cpu_quota(1 / 4, weight=cpu_limits.PRIORITY_WEIGHT) as group:
        group.add_tree(pids["worker:1"])
        started = time.monotonic()
        wait_for_line(console, "is the slowest", NAMED_WITHIN, proc)
        quota_named = time.monotonic() - started
        lines = slowest_lines(console)
        assert len(lines) == 1 and re.search(r"\[mgpu\] worker:1 on \S+ is the slowest: busy \d+% of the last "
                                             rf"{WINDOW:g} s, the others \d+%: they wait for it \(CPU samples\)", lines[0]), lines
        # The console line comes first; run.json is written after it.
        slowest = wait_for(lambda: ((record(runs, run_id).get("attempts") or [{}])[-1]).get("slowest"), 30,
                           "the slowest task in run.json")
        assert slowest["task"] == "worker:1"
        quota_shares = busy(runs, run_id)

    # worker:0 shares its group's time with a burner of a higher priority (nice -10: about nine
    # tenths of the group's time), worker:1 has a group of its own, as heavy, on the same core:
    # worker:0 waits for the core while worker:1 computes, and worker:1 then waits for worker:0.
    with cpu_limits.cpu_weight(cpu_limits.PRIORITY_WEIGHT, "second") as second, \
            cpu_limits.burner(core) as burning:
        second.add_tree(pids["worker:1"])
        first.add(burning.pid)
        os.setpriority(os.PRIO_PROCESS, burning.pid, -10)
        started = time.monotonic()
        wait_for(lambda: len(slowest_lines(console)) == 2 or proc.poll() is not None, NAMED_WITHIN,
                 lambda: f"worker:0 named: {busy(runs, run_id)}", interval=0.5)
        shared_named = time.monotonic() - started
        assert "worker:0 on " in slowest_lines(console)[1]
    return even, quota_named, quota_shares, shared_named


def test_the_slow_task_is_named_and_an_even_cluster_is_not(tmp_path):
    needs.require("torch")
    core = max(os.sched_getaffinity(0))
    runs = tmp_path / "runs"
    run_id = f"pace-{os.getpid()}"
    hold = tmp_path / "hold"
    console = tmp_path / "console.txt"
    with open(console, "w") as out:
        proc = start_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(runs),
                          "--slow-window", f"{WINDOW:g}",
                          "--start-timeout", "240", "--", sys.executable, PROGRAM, str(hold), WORK, stdout=out)
    try:
        # On their core from their start: the time before training shows costs one core, not two.
        pids = wait_for(lambda: started_pids(runs, run_id), 300, "the tasks' pids in run.json")
        with cpu_limits.cpu_weight(cpu_limits.PRIORITY_WEIGHT, "first") as first:
            for pid in pids.values():
                first.add_tree(pid)
                cpu_limits.pin_tree(pid, {core})
            wait_for(lambda: busy(runs, run_id), 300, "busy shares in run.json")
            even, quota_named, quota_shares, shared_named = phases(proc, runs, run_id, console, pids, first, core)

        hold.touch()
        assert proc.wait(120) == 0, console.read_text()[-3000:]
        print(f"even shares {even}; quota: named after {quota_named:.0f} s, shares {quota_shares}; "
              f"shared core: named after {shared_named:.0f} s")
        status = subprocess.run([sys.executable, "-m", "launcher", "status", run_id, "--log-dir", str(runs)],
                                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert "BUSY" in status.stdout and "slowest: worker:" in status.stdout, status.stdout
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)


# Sleeps, and says it spent its time computing (MGPU_TASK_INDEX 1) or waiting (the others), until
# the file HOLD exists.
SPLIT_PRINTER = (
    "import os, time\n"
    "slow = os.environ['MGPU_TASK_INDEX'] == '1'\n"
    "while not os.path.exists(os.environ['HOLD']):\n"
    "    time.sleep(0.5)\n"
    "    print('MGPU_TIME_SPLIT', *((480, 20) if slow else (200, 300)), flush=True)\n"
)
# The split is exact, not sampled: a short window shows the rule as well as a long one.
SPLIT_WINDOW = 8.0


def test_the_tasks_own_time_split_names_the_slow_task_where_cpu_samples_see_nothing(tmp_path):
    """Every task sleeps (CPU samples: all waiting) but prints its time split: the one that says it
    computes while the others wait is named, from its split, and `mgpu status` marks the shares."""
    runs = tmp_path / "runs"
    run_id = f"split-{os.getpid()}"
    console = tmp_path / "console.txt"
    hold = tmp_path / "hold"
    with open(console, "w") as out:
        proc = start_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(runs),
                          "--slow-window", f"{SPLIT_WINDOW:g}", "--",
                          sys.executable, "-c", SPLIT_PRINTER, stdout=out,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HOLD": str(hold)})
    try:
        wait_for_line(console, "is the slowest", SPLIT_WINDOW + 120, proc)
        lines = slowest_lines(console)
        assert len(lines) == 1 and re.search(rf"\[mgpu\] worker:1 on \S+ is the slowest: busy 96% of the last {SPLIT_WINDOW:g} s, "
                                             r"the others 40%: they wait for it \(its own time split\)", lines[0]), lines
        assert "MGPU_TIME_SPLIT" not in console.read_text()
        status = subprocess.run([sys.executable, "-m", "launcher", "status", run_id, "--log-dir", str(runs)],
                                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert re.search(r"worker:1 .* 96%\*", status.stdout) and "slowest: worker:1" in status.stdout, status.stdout
        hold.touch()
        assert proc.wait(120) == 0, console.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
