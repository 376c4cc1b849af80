"""`mgpu launch --slurm` on a real one-node Slurm: a step's failures, restarts, signals, scancel, stalls and stacks."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

from launcher.host import proctree
from slurm_helpers import MGPU, NODE, SlurmLab, in_allocation, launch_argv, program, run_id, run_record


def tagged_processes(rid: str) -> list[psutil.Process]:
    found = []
    for proc in proctree.every_process():
        try:
            if proc.environ().get("MGPU_RUN_ID") == rid:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_nothing_left(slurm: SlurmLab, rid: str, job_alive: bool = False) -> None:
    """No process of the run and no job step remain (nor any job, unless `job_alive`)."""
    def left():
        return tagged_processes(rid) or slurm.run("squeue", "-h", "-s").stdout.strip() or (
            not job_alive and slurm.run("squeue", "-h").stdout.strip())

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(rid) == []
    assert slurm.run("squeue", "-h", "-s").stdout.strip() == ""


def test_fail_fast_stops_the_step(slurm, tmp_path):
    rid = run_id("failfast")
    env_plan = json.dumps({"0": "forever", "1": "fail"})
    start = time.monotonic()
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--env", f"TEST_ORDERS={env_plan}",
                                                      "--", *program(tmp_path)))
    elapsed = time.monotonic() - start
    assert done.returncode == 1, done.stdout + done.stderr
    assert "worker:1 on" in done.stderr and "exited with code 1" in done.stderr
    assert elapsed < 60
    attempt = run_record(tmp_path, rid)["attempts"][0]["tasks"]
    assert attempt["worker:1"]["exit_code"] == 1
    # worker:0 never ends by itself: it was stopped, by its SIGTERM handler or by a signal.
    assert attempt["worker:0"]["exit_code"] in (143, None) and attempt["worker:0"]["exit_code"] != 0
    assert run_record(tmp_path, rid)["status"] == "failed"
    assert_nothing_left(slurm, rid)


def test_restart_runs_a_new_step(slurm, tmp_path):
    rid = run_id("restart")
    env_plan = json.dumps({"1@0": "fail"})
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--max-restarts", "1", "--env",
                                                      f"TEST_ORDERS={env_plan}", "--", *program(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    record = run_record(tmp_path, rid)
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]
    assert record["attempts"][0]["tasks"]["worker:1"]["exit_code"] == 1
    assert record["attempts"][1]["tasks"]["worker:1"]["exit_code"] == 0
    log = (tmp_path / "runs" / rid / "worker-1.log").read_text()
    assert log.count("SEEN") == 2 and "----- mgpu: attempt 2 started" in log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_launcher_stops_every_task(slurm, tmp_path, signum):
    """SIGTERM: each task gets SIGTERM and mgpu exits 143. SIGKILL: srun, bound to the launcher's
    life, ends the step at once, while the allocation itself lives on."""
    rid = run_id("signal")
    env_plan = json.dumps({"0": "forever", "1": "forever"})
    pid_file, gone_file, sleep_file = tmp_path / "mgpu.pid", tmp_path / "launcher-gone", tmp_path / "sleep.pid"
    argv = launch_argv(tmp_path, rid, "--env", f"TEST_ORDERS={env_plan}", "--", *program(tmp_path))
    script = f"{shlex.join(argv)} & echo $! > {pid_file}; wait $!; code=$?; "
    if signum == signal.SIGKILL:  # keep the allocation while the test looks
        script += f"sleep 60 & echo $! > {sleep_file}; touch {gone_file}; wait $!; "
    script += "exit $code"
    proc = subprocess.Popen(["salloc", "--quiet", "--ntasks=2", "--time=10", "sh", "-c", script], env=slurm.env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        logs = [tmp_path / "runs" / rid / f"worker-{i}.log" for i in range(2)]
        deadline = time.monotonic() + 60
        while not all(log.exists() and "SEEN" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and proc.poll() is None, "the tasks did not start"
            time.sleep(0.2)
        os.kill(int(pid_file.read_text()), signum)
        if signum == signal.SIGKILL:
            deadline = time.monotonic() + 20
            while not gone_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert_nothing_left(slurm, rid, job_alive=True)
            assert slurm.run("squeue", "-h").stdout.strip(), "the allocation should still be there"
            os.kill(int(sleep_file.read_text()), signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_nothing_left(slurm, rid)
    if signum == signal.SIGTERM:
        assert proc.returncode == 143, out + err
        assert all("got SIGTERM" in log.read_text() for log in logs)
        assert run_record(tmp_path, rid)["status"] == "interrupted"


def test_scancel_stops_everything(slurm, tmp_path):
    rid = run_id("scancel")
    env_plan = json.dumps({"0": "forever", "1": "forever"})
    argv = launch_argv(tmp_path, rid, "--env", f"TEST_ORDERS={env_plan}", "--", *program(tmp_path))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    submitted = slurm.run("sbatch", "--parsable", "--ntasks=2", "--time=10", f"--output={tmp_path}/job.out",
                          str(script), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    logs = [tmp_path / "runs" / rid / f"worker-{i}.log" for i in range(2)]
    deadline = time.monotonic() + 60
    while not all(log.exists() and "SEEN" in log.read_text() for log in logs):
        assert time.monotonic() < deadline, "the tasks did not start: " + slurm.run("squeue").stdout
        time.sleep(0.2)
    assert slurm.run("scancel", job).returncode == 0
    assert_nothing_left(slurm, rid)
    # Slurm sent SIGTERM to the batch script (mgpu) and to the step; mgpu stopped every task.
    assert run_record(tmp_path, rid)["status"] == "interrupted"
    assert all("got SIGTERM" in log.read_text() for log in logs)


# Rank 0 ignores SIGTERM, writes its pid to DIR/stubborn, and runs until it is killed; rank 1
# fails once DIR/go is there.
FAILS_BESIDE_A_STUBBORN_TASK = r"""
import os, signal, sys, time
if os.environ["SLURM_PROCID"] == "1":
    while not os.path.exists(os.path.join(sys.argv[1], "go")):
        time.sleep(0.05)
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(sys.argv[1], "stubborn.part"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(sys.argv[1], "stubborn.part"), os.path.join(sys.argv[1], "stubborn"))
while True:
    time.sleep(1)
"""


def test_slurm_itself_ends_the_step_when_a_task_fails(slurm, tmp_path):
    """srun runs with --kill-on-bad-exit: while mgpu is stopped (SIGSTOP), so that only Slurm can
    act, a task that ignores SIGTERM still ends as soon as its peer has failed."""
    rid = run_id("kill-on-bad-exit")
    script, signs, pid_file = tmp_path / "stubborn.py", tmp_path / "signs", tmp_path / "mgpu.pid"
    script.write_text(FAILS_BESIDE_A_STUBBORN_TASK)
    signs.mkdir()
    argv = launch_argv(tmp_path, rid, "--", sys.executable, str(script), str(signs))
    argv[argv.index("--grace-period") + 1] = "600"
    proc = subprocess.Popen(["salloc", "--quiet", "--ntasks=2", "--time=10", "sh", "-c",
                             f"{shlex.join(argv)} & echo $! > {pid_file}; wait $!"],
                            env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    launcher = None
    try:
        deadline = time.monotonic() + 60
        while not ((signs / "stubborn").exists() and pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None, "the tasks did not start"
            time.sleep(0.1)
        launcher = int(pid_file.read_text())
        stubborn = psutil.Process(int((signs / "stubborn").read_text()))
        os.kill(launcher, signal.SIGSTOP)
        (signs / "go").touch()
        stubborn.wait(60)  # raises TimeoutExpired if Slurm left it running
        os.kill(launcher, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # the test failed: end mgpu (its grace period is long), the job, salloc
            if launcher is not None:
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(launcher, signum)
                    except ProcessLookupError:
                        pass
            slurm.run("scancel", "--full", "--user", "root")
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "mgpu: error: worker:1 on" in err and "exited with code 1" in err
    tasks = run_record(tmp_path, rid)["attempts"][0]["tasks"]
    assert tasks["worker:1"]["exit_code"] == 1
    assert tasks["worker:0"]["exit_code"] != 0
    assert_nothing_left(slurm, rid)


# The evaluator fails at once; the workers go on until run.json says its failure was ignored.
EVALUATOR_FAILS = r"""
import json, os, sys, time
if os.environ["MGPU_TASK_TYPE"] == "evaluator":
    sys.exit(3)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        with open(sys.argv[1]) as f:
            task = json.load(f)["attempts"][0]["tasks"]["evaluator:0"]
        if task.get("failure_ignored"):
            print("the evaluator's failure was ignored", flush=True)
            sys.exit(0)
    except (OSError, ValueError, KeyError, IndexError):
        pass
    time.sleep(0.1)
sys.exit(4)
"""


def test_a_failing_evaluator_leaves_the_step_running(slurm, tmp_path):
    """With an evaluator, srun runs without --kill-on-bad-exit: its failure ends neither the step
    nor the run."""
    rid = run_id("evaluator")
    script = tmp_path / "evaluator.py"
    script.write_text(EVALUATOR_FAILS)
    done = in_allocation(slurm, tmp_path, launch_argv(
        tmp_path, rid, "--evaluator", "--", sys.executable, str(script), str(tmp_path / "runs" / rid / "run.json")),
        tasks=3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "evaluator:0 exited with code 3; training goes on without it" in done.stdout + done.stderr
    record = run_record(tmp_path, rid)
    assert record["status"] == "succeeded"
    tasks = record["attempts"][0]["tasks"]
    assert (tasks["evaluator:0"]["exit_code"], tasks["evaluator:0"]["failure_ignored"]) == (3, True)
    assert [tasks[f"worker:{i}"]["exit_code"] for i in range(2)] == [0, 0]
    for i in range(2):
        assert "the evaluator's failure was ignored" in (tmp_path / "runs" / rid / f"worker-{i}.log").read_text()


# Prints until every task of the step runs (each leaves a file in DIR), then waits in silence.
SILENT_ONCE_ALL_RUN = r"""
import os, pathlib, sys, time
started = pathlib.Path(sys.argv[1])
(started / os.environ["SLURM_PROCID"]).touch()
def wait_for_data():
    time.sleep(600)
while len(list(started.iterdir())) < int(os.environ["SLURM_NTASKS"]):
    print("waiting for the other tasks", flush=True)
    time.sleep(0.1)
print("loading", flush=True)
wait_for_data()
"""


def test_a_silent_step_is_stopped_as_stalled_with_its_stacks(slurm, tmp_path):
    """Under Slurm only output counts as progress: tasks that print until all of them run, then wait
    in silence, are stopped once --stall-timeout passes, and the report says where each one was."""
    rid = run_id("stall")
    script = tmp_path / "silent.py"
    script.write_text(SILENT_ONCE_ALL_RUN)
    started = tmp_path / "started"
    started.mkdir()
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--stall-timeout", "2", "--",
                                                      sys.executable, str(script), str(started)))
    assert done.returncode == 1, done.stdout + done.stderr
    report = done.stderr[done.stderr.index("mgpu: error: "):].splitlines()
    assert report[0].startswith("mgpu: error: stall: no training task made progress for "), report
    for index in range(2):
        at = report.index(f"worker:{index} on {NODE}: in its own code, not in a collective")
        assert any(line.endswith(" in wait_for_data") and "silent.py:" in line for line in report[at:]), report
    assert report[-2] == f"stacks: {tmp_path / 'runs' / rid / 'stacks-0.txt'}"
    assert report[-1].startswith("hint: a program that computes for longer than 2 s without printing")
    assert "(no output; CPU use not measured)" in done.stdout + done.stderr  # Slurm's tasks' CPU is not counted
    assert run_record(tmp_path, rid)["status"] == "stalled"
    assert "wait_for_data" in (tmp_path / "runs" / rid / "stacks-0.txt").read_text()
    assert_nothing_left(slurm, rid)


def test_a_stopped_task_of_a_step_is_named_and_charged_with_the_stall(slurm, tmp_path):
    """Slurm's backend does not follow its tasks' state, so the stall's request for stacks, run on
    each task's node, also reads each process's state there: worker:1, stopped (SIGSTOP), is the one
    the others waited for."""
    rid = run_id("stopped")
    program = 'echo up; if [ "$SLURM_PROCID" = 1 ]; then kill -STOP $$; fi; exec sleep 60'
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--stall-timeout", "2", "--", "sh", "-c", program))
    assert done.returncode == 1, done.stdout + done.stderr
    attempt = run_record(tmp_path, rid)["attempts"][0]
    assert (attempt["cause"], attempt["task"], attempt["host"]) == ("stalled", "worker:1", NODE), done.stderr
    assert f"worker:1 on {NODE} is stopped (SIGSTOP, or a debugger)" in done.stdout + done.stderr
    assert_nothing_left(slurm, rid)


def test_asking_a_stalled_step_for_its_stacks_leaves_no_core_file(slurm, tmp_path):
    """With core dumps on in the tasks, the SIGABRT that asks for their stacks would leave a core file
    of every process in the task's folder: mgpu lowers their core limit to 0 first, on every node.
    Each task's child shell reads its own limit as the signal arrives (tests/programs/core_limit_task.py)."""
    rid = run_id("cores")
    program = pathlib.Path(__file__).parents[2] / "programs" / "core_limit_task.py"
    # MGPU_PY_SPY empty: no py-spy, so the stacks are asked for with SIGABRT, as where it cannot attach.
    done = in_allocation(slurm, tmp_path, ["env", "MGPU_PY_SPY=", *launch_argv(tmp_path, rid, "--stall-timeout", "2",
                                                                              "--", sys.executable, str(program))])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "mgpu: error: stall: no training task made progress for " in done.stderr, done.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    for index in range(2):
        assert f"limits-{index}.txt" in left, (left, done.stdout + done.stderr)
        limits = (tmp_path / f"limits-{index}.txt").read_text().split()
        assert limits[4] == "0", limits  # Max core file size <soft> <hard> bytes
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]
    assert_nothing_left(slurm, rid)


STACKS_IN_A_STEP = """
set -u
{launch} >launch.out 2>&1 &
launch=$!
for _ in $(seq 600); do
    [ "$(cat runs/{rid}/worker-0.log runs/{rid}/worker-1.log 2>/dev/null | grep -c waiting)" = 2 ] && break
    sleep 0.1
done
{stacks} >stacks.out 2>stacks.err
echo "stacks-exit=$?"
touch go
wait $launch
echo "launch-exit=$?"
"""


def test_stacks_of_a_slurm_steps_tasks_are_read_on_their_node_and_the_run_then_succeeds(slurm, tmp_path):
    """`mgpu stacks` from the allocation's shell: py-spy runs in a step beside the tasks' (--overlap) and
    reads each task's processes by its rank; the run then ends as it would have."""
    rid = run_id("stacks")
    program = pathlib.Path(__file__).parents[2] / "programs" / "waits_for_go.py"
    launch = shlex.join(launch_argv(tmp_path, rid, "--", sys.executable, str(program), str(tmp_path / "go")))
    stacks = shlex.join([*MGPU, "stacks", rid, "--log-dir", str(tmp_path / "runs")])
    done = in_allocation(slurm, tmp_path, ["bash", "-c", STACKS_IN_A_STEP.format(launch=launch, rid=rid, stacks=stacks)])
    out = (tmp_path / "stacks.out").read_text()
    assert "stacks-exit=0" in done.stdout, done.stdout + (tmp_path / "stacks.err").read_text()
    for index in range(2):
        section = out.split(f"===== worker:{index} on {NODE} =====\n")[1].split("=====")[0]
        assert f"{program}:" in section and " in waits_for_go\n" in section, out
    assert "launch-exit=0" in done.stdout, (tmp_path / "launch.out").read_text()
    assert run_record(tmp_path, rid)["status"] == "succeeded"
    assert_nothing_left(slurm, rid)
