"""What docs/long-runs.md promises of a run that needs no terminal, each held with the real `mgpu`:
a detached launch whose checks fail says so here and exits 1, `logs -f` and `attach` end with the
run's exit code, a failed attempt is told on the console, and Ctrl-C and SIGTERM still stop a run
whose terminal has hung up."""

import signal
import socket
import subprocess

import pytest

from launching import run_mgpu, start_mgpu, wait_for, wait_for_line
from supervisor_helpers import FAKE_WORKER, assert_run_gone, read_pids, records, runs  # noqa: F401 - runs: a fixture

pytestmark = pytest.mark.timeout(120)


def test_a_detached_launch_whose_check_fails_says_so_here_and_exits_1(run_id, runs):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        done = runs.mgpu("launch", "--detach", "--workers", f"127.0.0.1:{port}", "--run-id", run_id, "--",
                         "python3", "-c", "pass")
    finally:
        taken.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "goes on detached" not in done.stdout
    assert f"127.0.0.1:{port}" in done.stderr and "mgpu: error:" in done.stderr, done.stderr


def test_logs_f_and_attach_end_with_a_failed_runs_code_and_the_attempt_is_told(run_id, record_dir, runs):
    out = runs.detach(run_id, "--record", str(record_dir), "--until-file", str(runs.go), "--fail", "worker:1=3")
    assert "goes on detached" in out
    wait_for(lambda: len(records(record_dir)) == 2, 30, what="both tasks started")
    follow = start_mgpu("logs", run_id, "-f", "--log-dir", str(runs.log_dir))
    attached = runs.log_dir / "attach.err"
    with open(attached, "w") as said:
        attach = start_mgpu("attach", run_id, "--log-dir", str(runs.log_dir), stdout=subprocess.DEVNULL, stderr=said)
    try:
        wait_for_line(attached, f"mgpu: attached to run {run_id}", 30, attach)
        runs.go.touch()
        text, _ = follow.communicate(timeout=60)
        assert follow.returncode == 1, text
        assert attach.wait(60) == 1, attached.read_text()
        assert f"mgpu: run {run_id} failed (exit 1)" in attached.read_text()
    finally:
        for proc in (follow, attach):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "[mgpu] worker:1 exited with code 3; stopping all tasks" in text
    assert runs.status(run_id)["state"] == "failed"
    assert_run_gone(run_id)


def test_an_attempt_that_fails_is_told_on_the_console_before_the_restart(run_id, runs):
    launch = run_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(runs.log_dir),
                      "--max-restarts", "1", "--grace-period", "1", "--", *FAKE_WORKER, "--fail", "worker:1=3")
    assert launch.returncode == 1, launch.stderr
    console = launch.stdout + launch.stderr
    assert "[mgpu] attempt 1 failed: program-error (worker:1 on 127.0.0.1): " in console, console
    assert "[mgpu] restarting all tasks (restart 1 of 1)" in console
    assert_run_gone(run_id)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_still_stops_a_run_whose_terminal_hung_up(run_id, record_dir, runs, signum, code):
    launch = start_mgpu(*runs.launch_args(run_id, "--record", str(record_dir), "--forever",
                                          "--grandchild", "all"), start_new_session=True)
    try:
        wait_for(lambda: len(records(record_dir)) == 2 and len(read_pids(record_dir)) == 2, 30,
                 what="both tasks and their children started")
        launch.send_signal(signal.SIGHUP)
        console = runs.log_dir / run_id / "console.log"
        wait_for_line(console, "[mgpu] the terminal hung up (SIGHUP); the run goes on", 30, launch)
        launch.send_signal(signum)
        assert launch.wait(60) == code
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert runs.record(run_id)["status"] == "interrupted"
    assert_run_gone(run_id)
