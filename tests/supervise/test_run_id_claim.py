"""A run id is one run on the whole machine, whatever the log dir: the end of a run stops every
process of this user that carries its id, so two runs with one id would stop each other's tasks."""

import pathlib
import secrets
import signal
import subprocess
import sys

from launching import run_mgpu, start_mgpu, wait_for

HOLD = [sys.executable, "-c", "import time; print('task up', flush=True); time.sleep(120)"]


def start_launch(run_id: str, log_dir: pathlib.Path, command: list[str]) -> subprocess.Popen:
    # With the pre-launch reachability probe: between the check of the run id and the tasks' start.
    return start_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(log_dir), "--", *command,
                      stderr=subprocess.PIPE)


def wait_for_line(proc: subprocess.Popen, text: str) -> None:
    for line in proc.stdout:  # ends when the launcher exits; the test's timeout bounds it
        if text in line:
            return
    raise AssertionError(f"the launch ended before printing {text!r}: {proc.stderr.read()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_a_run_id_in_use_under_another_log_dir_is_refused(tmp_path):
    """The first run's task has dropped MGPU_RUN_ID from its environment (as `env -i`, sudo or a
    daemon would), so no process scan can find it: the run id's claim still does."""
    run_id = f"claim-{secrets.token_hex(4)}"
    first = start_launch(run_id, tmp_path / "one", ["env", "-u", "MGPU_RUN_ID", *HOLD])
    try:
        wait_for_line(first, "task up")
        second = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "two"),
                          "--", "true")
        assert second.returncode == 2, second.stderr
        assert second.stderr == (f"mgpu: error: run id {run_id} is in use by running processes (pid {first.pid}: "
                                 f"a launch on this machine, in any log dir); choose another run id\n")
        assert not (tmp_path / "two" / run_id).exists()
        assert first.poll() is None
    finally:
        stop(first)
    # Once the first run is over, the id is free again (its lock file is gone with it).
    again = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "two"), "--", "true")
    assert again.returncode == 0, again.stderr


def test_two_launches_started_together_with_one_run_id_in_two_log_dirs(tmp_path):
    """Started at the same moment, neither sees a task of the other yet: exactly one runs."""
    for attempt in range(3):
        run_id = f"race-{attempt}-{secrets.token_hex(4)}"
        launches = [start_launch(run_id, tmp_path / f"{attempt}-{side}", HOLD) for side in ("a", "b")]
        try:
            wait_for(lambda: any(proc.poll() is not None for proc in launches), 60, what="a launcher to exit")
            refused = [proc for proc in launches if proc.poll() is not None]
            assert len(refused) == 1, [proc.poll() for proc in launches]
            assert refused[0].returncode == 2, refused[0].stderr.read()
            assert "is in use" in refused[0].stderr.read()
            running = next(proc for proc in launches if proc is not refused[0])
            wait_for_line(running, "task up")
            assert running.poll() is None
        finally:
            for proc in launches:
                stop(proc)
