"""Runs that need no terminal, with the real `mgpu`: `launch --detach`, a launch whose terminal
hangs up, and `status`, `logs`, `attach` and `stop` from other shells."""

import json
import os
import shutil
import signal
import subprocess

import pytest

import needs

from launching import MGPU, mgpu_env, run_mgpu, start_mgpu, wait_for, wait_for_line
from supervisor_helpers import assert_run_gone, pid_alive, read_pids, records, runs  # noqa: F401 - runs: a fixture

pytestmark = pytest.mark.timeout(120)


def test_a_detached_run_goes_on_without_its_shell_and_is_followed_to_its_end(run_id, record_dir, runs):
    out = runs.detach(run_id, "--record", str(record_dir), "--until-file", str(runs.go), "--lines", "1")
    assert f"run {run_id} goes on detached" in out and f"mgpu logs {run_id} --log-dir" in out
    wait_for(lambda: len(records(record_dir)) == 2, 30, what="both tasks started")
    status = runs.status(run_id)
    assert status["state"] == "running"
    pid = status["supervisor_pid"]
    # A supervisor of its own: its own session, no terminal, standard input from /dev/null.
    assert os.getsid(pid) == pid
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(runs.log_dir / run_id / "console.log")
    listed = runs.mgpu("status")
    assert listed.returncode == 0 and run_id in listed.stdout and "running" in listed.stdout
    # attach shows the live console; Ctrl-C leaves the run running.
    attached_out = runs.log_dir / "attach.out"
    with open(attached_out, "w") as out:
        attach = start_mgpu("attach", run_id, "--log-dir", str(runs.log_dir), stdout=out)
    try:
        wait_for_line(attached_out, "[worker:1] out worker:1 0", 30, attach)
        attach.send_signal(signal.SIGINT)
        assert attach.wait(30) == 0
    finally:
        if attach.poll() is None:
            attach.kill()
    assert f"mgpu: detached from run {run_id}; it goes on" in attached_out.read_text()
    assert runs.status(run_id)["state"] == "running"
    follow = start_mgpu("logs", run_id[:-2], "-f", "--log-dir", str(runs.log_dir))
    runs.go.touch()
    text, _ = follow.communicate(timeout=60)
    assert follow.returncode == 0, text
    assert "[worker:1] out worker:1 0" in text and "[mgpu] done: 2 tasks succeeded" in text
    assert runs.status("last")["state"] == "succeeded"
    task = runs.mgpu("logs", run_id, "--task", "worker:1")
    assert task.returncode == 0 and "out worker:1 0" in task.stdout
    assert_run_gone(run_id)


def test_stop_ends_a_detached_run_and_logs_f_exits_with_its_code(run_id, record_dir, runs):
    runs.detach(run_id, "--record", str(record_dir), "--forever", "--grandchild", "all", "--setsid-grandchild", "all")
    wait_for(lambda: len(read_pids(record_dir)) == 4 and len(records(record_dir)) == 2, 30, what="tasks and sleepers")
    follow = start_mgpu("logs", run_id, "-f", "--log-dir", str(runs.log_dir))
    stop = runs.mgpu("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert f"run {run_id} interrupted (exit 143)" in stop.stdout
    text, _ = follow.communicate(timeout=60)
    assert follow.returncode == 143, text
    assert "[mgpu] received SIGTERM; stopping all tasks" in text
    assert not any(pid_alive(pid) for pid in read_pids(record_dir))
    assert_run_gone(run_id)
    again = runs.mgpu("stop", run_id)
    assert again.returncode == 2 and again.stderr.count("\n") == 1


def test_stop_now_skips_the_grace_period(run_id, record_dir, runs):
    runs.detach(run_id, "--record", str(record_dir), "--forever", "--ignore-term", "all", grace=300)
    wait_for(lambda: len(records(record_dir)) == 2, 30, what="both tasks started")
    stop = runs.mgpu("stop", run_id, "--now", timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert "[mgpu] second signal: killing all tasks now" in (runs.log_dir / run_id / "console.log").read_text()
    tasks = runs.record(run_id)["attempts"][0]["tasks"]
    assert {task["signal"] for task in tasks.values()} == {"SIGKILL"}
    assert_run_gone(run_id)


def test_a_foreground_launch_whose_terminal_closes_finishes_its_run(run_id, record_dir, runs):
    """A real terminal: mgpu runs in a pseudo-terminal that is its controlling terminal; closing
    the terminal's master side hangs it up (SIGHUP), while its console may be blocked writing."""
    master, slave = os.openpty()
    try:
        launch = subprocess.Popen(["setsid", "--ctty", *MGPU, *runs.launch_args(
            run_id, "--record", str(record_dir), "--until-file", str(runs.go), "--lines", "200")],
            env=mgpu_env(), stdin=slave, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    try:
        wait_for(lambda: len(records(record_dir)) == 2, 30, what="both tasks started")
        os.close(master)  # the terminal is gone
        master = None
        console = runs.log_dir / run_id / "console.log"
        wait_for_line(console, "[mgpu] the terminal hung up (SIGHUP); the run goes on", 30, launch)
        runs.go.touch()
        assert launch.wait(60) == 0
    finally:
        if master is not None:
            os.close(master)
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert "[mgpu] done: 2 tasks succeeded" in console.read_text()
    assert runs.record(run_id)["status"] == "succeeded"
    assert_run_gone(run_id)


def test_a_killed_detached_supervisor_leaves_launcher_died_and_no_task(run_id, record_dir, runs):
    runs.detach(run_id, "--record", str(record_dir), "--forever", "--grandchild", "all")
    wait_for(lambda: len(read_pids(record_dir)) == 2 and len(records(record_dir)) == 2, 30, what="tasks and sleepers")
    os.kill(runs.status(run_id)["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: runs.record(run_id)["status"] == "launcher-died", 30, what="run.json launcher-died")
    assert runs.status(run_id)["state"] == "launcher-died"
    assert not any(pid_alive(pid) for pid in read_pids(record_dir))
    assert_run_gone(run_id)


def test_a_detached_launch_refused_before_it_starts_says_so_here(run_id, runs):
    (runs.log_dir / run_id).mkdir(parents=True)  # the run id is taken in this log dir
    done = run_mgpu(*runs.launch_args(run_id, workers=1), "--detach")
    assert done.returncode == 2 and f"run {run_id} already exists" in done.stderr
    assert "goes on detached" not in done.stdout
    slurm = run_mgpu("launch", "--slurm", "--detach", "--log-dir", str(runs.log_dir), env=mgpu_env(SLURM_JOB_ID="1"))
    assert slurm.returncode == 2 and "sbatch" in slurm.stderr


def test_status_of_a_run_that_is_not_yours_or_not_there_is_one_line(runs):
    needs.root()  # a folder of another user's
    theirs = runs.log_dir / "theirs"
    theirs.mkdir(parents=True)
    (theirs / "run.json").write_text(json.dumps({"run_id": "theirs", "status": "running", "started_at": "x"}))
    os.chown(theirs, 65534, 65534)  # nobody's
    for name in ("theirs", "nothing-here"):
        done = runs.mgpu("status", name)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no run" in done.stderr, done.stderr
    assert "theirs" not in runs.mgpu("status").stdout
    assert runs.mgpu("stop", "theirs").returncode == 2


def test_a_second_stop_waits_for_the_stop_under_way(run_id, record_dir, runs):
    """Two `mgpu stop` at once: the second SIGTERM is not a kill-now. The tasks ignore SIGTERM and
    leave once the test says so; they must get that far, not SIGKILL."""
    launch = start_mgpu(*runs.launch_args(run_id, "--record", str(record_dir), "--ignore-term", "all",
                                          "--until-file", str(runs.go), grace=300), start_new_session=True)
    try:
        wait_for(lambda: len(records(record_dir)) == 2, 30, what="both tasks started")
        stops = [start_mgpu("stop", run_id, "--log-dir", str(runs.log_dir), stderr=subprocess.PIPE)
                 for _ in range(2)]
        for stop in stops:
            said = stop.stderr.readline()
            assert said.startswith(f"mgpu: stopping run {run_id}"), said + stop.stderr.read()
        # Both SIGTERMs are in: the stop's loop goes round once more on the hang-up, and with a
        # kill-now rule for the second one, kills the tasks in that very round.
        launch.send_signal(signal.SIGHUP)
        console = runs.log_dir / run_id / "console.log"
        wait_for_line(console, "[mgpu] the terminal hung up (SIGHUP); the run goes on", 30, launch)
        runs.go.touch()
        for stop in stops:
            out, err = stop.communicate(timeout=60)
            assert stop.returncode == 0 and f"mgpu: run {run_id} interrupted (exit 143)" in out, out + err
        assert launch.wait(60) == 143
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    text = console.read_text()
    assert "second signal: killing all tasks now" not in text, text
    # The stop's notice went to the terminal, or to console.log if the hang-up was seen first.
    assert "(SIGINT or `mgpu stop --now` to kill now)" in launch.stdout.read() + text
    tasks = runs.record(run_id)["attempts"][0]["tasks"]
    assert {(task["exit_code"], task["signal"]) for task in tasks.values()} == {(0, None)}, tasks
    assert_run_gone(run_id)


def test_a_detached_run_whose_folder_was_deleted_is_stopped_by_its_run_id(run_id, record_dir, runs):
    runs.detach(run_id, "--record", str(record_dir), "--forever", "--grandchild", "all")
    wait_for(lambda: len(read_pids(record_dir)) == 2 and len(records(record_dir)) == 2, 30, what="tasks and sleepers")
    supervisor = runs.status(run_id)["supervisor_pid"]
    runs.started.remove(run_id)  # its record goes with its folder: the fixture cannot find the supervisor
    shutil.rmtree(runs.log_dir / run_id)
    try:
        assert runs.mgpu("stop", run_id[:-2]).returncode == 2  # a start of a run id names no lock
        stop = runs.mgpu("stop", run_id)
        assert stop.returncode == 0, stop.stderr
        assert stop.stderr == (f"mgpu: stopping run {run_id} (supervisor pid {supervisor}, from its run id's lock: "
                               f"no folder of it in {runs.log_dir})\n")
        assert stop.stdout.startswith(f"mgpu: run {run_id} stopped (with no run folder in {runs.log_dir}"), stop.stdout
    finally:
        if pid_alive(supervisor):
            os.kill(supervisor, signal.SIGKILL)
    assert not pid_alive(supervisor)
    assert not any(pid_alive(pid) for pid in read_pids(record_dir))
    assert_run_gone(run_id)
    again = runs.mgpu("stop", run_id)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "no run" in again.stderr
