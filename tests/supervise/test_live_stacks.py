"""`mgpu stacks` on a live run with the real mgpu and py-spy: each task's stacks while it runs, the
run going on to succeed; where the host forbids attaching, one line that says so, at once."""

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

import needs
from launching import MGPU, mgpu_env, wait_for
from supervisor_helpers import HERE, assert_run_gone, runs  # noqa: F401 - runs: a fixture

pytestmark = pytest.mark.timeout(120)

WAITS_FOR_GO = HERE / "programs" / "waits_for_go.py"


def detach(runs, run_id, *task_argv, prefix=()):
    """`mgpu launch --detach` of two local tasks from a shell of its own session (under `prefix`)."""
    runs.started.append(run_id)
    argv = shlex.join([*prefix, *MGPU, "launch", "--detach", "--local", "2", "--run-id", run_id, "--log-dir",
                       str(runs.log_dir), "--grace-period", "1", "--", *task_argv])
    shell = subprocess.run(["bash", "-c", f"{argv}; echo shell-exit=$?"], env=mgpu_env(), capture_output=True,
                           text=True, timeout=60, start_new_session=True, stdin=subprocess.DEVNULL)
    assert "shell-exit=0" in shell.stdout, shell.stdout + shell.stderr


def both_waiting(runs, run_id):
    logs = [runs.log_dir / run_id / f"worker-{i}.log" for i in range(2)]
    return all(log.exists() and "waiting" in log.read_text() for log in logs)


def test_stacks_of_a_live_run_show_each_tasks_functions_and_the_run_then_succeeds(run_id, runs, tmp_path):
    needs.installed_version("py-spy")
    go = tmp_path / "go"
    detach(runs, run_id, sys.executable, str(WAITS_FOR_GO), str(go))
    wait_for(lambda: both_waiting(runs, run_id), 30, what="both tasks waiting")
    done = runs.mgpu("stacks", run_id)
    assert done.returncode == 0, done.stderr
    for index in range(2):
        section = done.stdout.split(f"===== worker:{index} on 127.0.0.1 =====\n")[1].split("=====")[0]
        assert f"{WAITS_FOR_GO}:" in section and " in waits_for_go\n" in section and " in <module>" in section, done.stdout
    kept = done.stderr.strip().splitlines()[-1].removeprefix("mgpu: kept in ")
    assert open(kept).read().count(" in waits_for_go\n") == 2
    one = runs.mgpu("stacks", run_id, "--task", "worker:1", "--native")
    assert one.returncode == 0, one.stderr
    assert "worker:0" not in one.stdout and "worker:1 on 127.0.0.1" in one.stdout
    assert "[native]" in one.stdout and " in waits_for_go\n" in one.stdout
    wrong = runs.mgpu("stacks", run_id, "--task", "worker:7")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "no task 'worker:7'" in wrong.stderr
    pid = runs.record(run_id)["attempts"][0]["tasks"]["worker:1"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        held = runs.mgpu("stacks", run_id, "--task", "worker:1")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert held.returncode == 1, held.stdout + held.stderr
    assert held.stdout.startswith("===== worker:1 on 127.0.0.1 =====\n(not read by py-spy)\n"), held.stdout
    assert ("mgpu: worker:1 on 127.0.0.1 is stopped (SIGSTOP, or a debugger), and py-spy cannot read a stopped "
            "process: continue it (kill -CONT)") in held.stderr, held.stderr
    go.touch()
    wait_for(lambda: runs.record(run_id).get("status") != "running", 60, what="the run's end")
    record = runs.record(run_id)
    assert record["status"] == "succeeded" and record["exit_code"] == 0
    assert {task["exit_code"] for task in record["attempts"][0]["tasks"].values()} == {0}
    assert_run_gone(run_id)


def test_where_attaching_is_forbidden_one_line_says_so_and_what_to_change(run_id, runs, tmp_path):
    """The tasks run as nobody, and mgpu as root without CAP_SYS_PTRACE: the kernel refuses py-spy
    the tasks, as it does another user's processes or a container's without SYS_PTRACE."""
    needs.root("setpriv")
    needs.installed_version("py-spy")
    detach(runs, run_id, "setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", "--",
           "/bin/sh", "-c", "echo waiting; exec sleep 120",
           prefix=("setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--"))
    wait_for(lambda: both_waiting(runs, run_id), 30, what="both tasks waiting")
    done = runs.mgpu("stacks", run_id, "--task", "worker:0")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("mgpu: worker:0 on 127.0.0.1: py-spy may not attach to pid "), done.stderr
    assert "(the process runs as uid 65534, mgpu as uid 0)" in lines[0]
    assert "kernel.yama.ptrace_scope=0" in lines[0] and "SYS_PTRACE" in lines[0]
    assert len([line for line in lines if "may not attach" in line]) == 1
    stop = runs.mgpu("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert_run_gone(run_id)
