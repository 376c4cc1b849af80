"""mgpu with its standard output closed (`>&-`) or read by a program that ends (`| head -1`), with
the real `mgpu` and real runs: a launch goes on (a detached one still detaches and says its run id
on stderr), another command ends with one line and exit 141, never an internal error."""

import json
import os
import signal
import subprocess
import sys

import pytest

from launching import MGPU, mgpu_env, wait_for

pytestmark = pytest.mark.timeout(120)

# A task that prints its first line, waits (bounded) for the test to have closed the reading end,
# then prints 500 more and ends: the launcher writes them to a console that is gone.
TASK = """
import os, sys, time
print("first line", flush=True)
deadline = time.monotonic() + 30
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.02)
for i in range(500):
    print("line", i, flush=True)
"""


def launch_args(tmp_path, run_id, *extra):
    return [*MGPU, "launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), *extra,
            "--", sys.executable, "-c", TASK, str(tmp_path / "go")]


def closed_stdout(argv):
    """argv run with descriptor 1 closed, as `argv >&-` in a shell."""
    return ["sh", "-c", 'exec "$@" >&-', "sh", *argv]


def record(tmp_path, run_id):
    return json.loads((tmp_path / "runs" / run_id / "run.json").read_text())


def ended(tmp_path, run_id):
    path = tmp_path / "runs" / run_id / "run.json"
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if found.get("status") not in (None, "running", "starting") else None


def assert_no_internal_error(stderr: str):
    assert "internal error" not in stderr and "Traceback" not in stderr and "Exception" not in stderr, stderr


@pytest.fixture
def detached_runs(tmp_path):
    """The run ids a test detaches; a supervisor still alive at its end is killed (its reaper stops the task)."""
    started = []
    yield started
    for run_id in started:
        try:
            pid = record(tmp_path, run_id).get("supervisor_pid")
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass


def test_a_foreground_launch_with_stdout_closed_runs_and_its_task_logs(tmp_path):
    (tmp_path / "go").touch()
    done = subprocess.run(closed_stdout(launch_args(tmp_path, "closed-fg")), env=mgpu_env(), capture_output=True,
                          text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert_no_internal_error(done.stderr)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith("mgpu: warning: standard output is closed"), done.stderr
    assert record(tmp_path, "closed-fg")["status"] == "succeeded"
    log = (tmp_path / "runs" / "closed-fg" / "worker-0.log").read_text()
    assert "first line" in log and "line 499" in log


def test_a_foreground_launch_whose_reader_ends_runs_on_to_the_runs_exit_code(tmp_path):
    proc = subprocess.Popen(launch_args(tmp_path, "pipe-fg"), env=mgpu_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        while b"first line" not in proc.stdout.readline():  # bounded by the test's timeout, and by EOF
            assert proc.poll() is None, proc.stderr.read()
        proc.stdout.close()  # the reader goes, as `| head -1` does
        (tmp_path / "go").touch()
        stderr = proc.stderr.read().decode()
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_no_internal_error(stderr)
    assert code == 0, stderr
    assert record(tmp_path, "pipe-fg")["status"] == "succeeded"
    assert "line 499" in (tmp_path / "runs" / "pipe-fg" / "worker-0.log").read_text()


def test_a_detached_launch_with_stdout_closed_still_detaches(tmp_path, detached_runs):
    (tmp_path / "go").touch()
    detached_runs.append("closed-detach")
    done = subprocess.run(closed_stdout(launch_args(tmp_path, "closed-detach", "--detach")), env=mgpu_env(),
                          capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
                          start_new_session=True)
    assert_no_internal_error(done.stderr)
    assert done.returncode == 0, done.stderr
    found = wait_for(lambda: ended(tmp_path, "closed-detach"), 60, "the detached run's end")
    assert found["status"] == "succeeded"


def test_a_detached_launch_whose_reader_has_gone_says_its_run_on_stderr(tmp_path, detached_runs):
    (tmp_path / "go").touch()
    detached_runs.append("pipe-detach")
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read what it prints
    try:
        done = subprocess.run(launch_args(tmp_path, "pipe-detach", "--detach"), env=mgpu_env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=90, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    finally:
        os.close(write_end)
    assert_no_internal_error(done.stderr)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"mgpu: run pipe-detach goes on detached; its console is in {tmp_path / 'runs' / 'pipe-detach' / 'console.log'}"
        " (standard output is closed)"], done.stderr
    found = wait_for(lambda: ended(tmp_path, "pipe-detach"), 60, "the detached run's end")
    assert found["status"] == "succeeded"


def test_another_command_whose_reader_has_gone_ends_with_one_line_and_141():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([*MGPU, "launch", "--workers", "h1:2222,h2:2222", "--dry-run"], env=mgpu_env(),
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    finally:
        os.close(write_end)
    assert done.stderr == "mgpu: error: standard output was closed (its reader ended) before mgpu finished writing\n"
    assert done.returncode == 141
