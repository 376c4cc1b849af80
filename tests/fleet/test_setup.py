"""--setup on this machine: once before the tasks, never again on a restart, and a setup that
outlives --setup-timeout stops the launch before any task starts. The setup is a task for what it
leaves behind: its processes are stopped when it ends, fails, times out or mgpu is stopped; and its
output is task output: escaped on the console, bounded in memory, byte-exact in its log, and a
console that does not read never holds it up."""

from __future__ import annotations

import json
import pathlib
import resource
import signal
import subprocess
import sys

import psutil
import pytest

from launching import MGPU, finish, mgpu_env, run_mgpu, start_mgpu, wait_for, wait_for_line

pytestmark = pytest.mark.timeout(120)

def test_the_setup_runs_once_and_a_restart_does_not_run_it_again(tmp_path, run_id):
    (tmp_path / "proj").mkdir()
    done = run_mgpu("launch", "--local", "1", "--sync", "proj", "--run-id", run_id, "--max-restarts", "1",
                    "--setup", "echo set up >> setups.txt",
                    # The first attempt fails, the second succeeds: one restart.
                    "--", "sh", "-c", "test -e failed-once || { touch failed-once; exit 3; }", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "proj" / "setups.txt").read_text() == "set up\n"  # in DIR itself, once
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert len(record["attempts"]) == 2
    assert (tmp_path / "mgpu-runs" / run_id / "setup-127.0.0.1.log").exists()


def test_a_setup_past_its_timeout_stops_the_launch(tmp_path, run_id):
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--setup", "echo waiting; exec sleep 60",
                    "--setup-timeout", "1", "--", "sh", "-c", "touch started", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[setup 127.0.0.1] waiting" in done.stdout
    assert done.stderr.startswith("mgpu: error: setup failed on 127.0.0.1: did not finish within 1 s; nothing "
                                  "was started. Its last lines:\n  waiting\n"), done.stderr
    assert not (tmp_path / "started").exists()


# -- what a setup leaves behind ----------------------------------------------------------------


@pytest.fixture
def pid_files(tmp_path):
    """Where a setup writes the pids of the processes it starts (one per file, `<name>.pid`); the
    `alive` check for them; whatever of them is still alive at the end is killed."""
    started: dict[pathlib.Path, float] = {}

    def process(path: pathlib.Path) -> psutil.Process | None:
        try:
            proc = psutil.Process(int(path.read_text()))
            if path not in started:
                started[path] = proc.create_time()
            # The very process the setup started, not a later one that reused its pid.
            if proc.create_time() == started[path] and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (OSError, ValueError, psutil.Error):
            pass
        return None

    def alive(name: str) -> bool:
        return process(tmp_path / f"{name}.pid") is not None

    yield alive
    for path in tmp_path.glob("*.pid"):
        if (proc := process(path)) is not None:
            proc.kill()


def test_a_failed_setup_leaves_no_background_child(tmp_path, run_id, pid_files):
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--grace-period", "1",
                    "--setup", "sleep 1000 & echo $! > child.pid; exit 1", "--", "true", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "setup failed on 127.0.0.1: exit code 1" in done.stderr
    assert (tmp_path / "child.pid").exists()
    assert not pid_files("child"), "the setup's background child outlived mgpu"


def test_a_setup_that_succeeds_leaves_no_child_that_left_its_session_to_the_tasks(tmp_path, run_id, pid_files):
    # The task copies what /proc says of the setup's child: nothing, or a zombie that nobody reaped.
    task = "cat /proc/$(cat child.pid)/stat > child-state 2>/dev/null; true"
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--grace-period", "1",
                    "--setup", "setsid sleep 1000 & echo $! > child.pid", "--", "sh", "-c", task, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "child.pid").exists()
    state = (tmp_path / "child-state").read_text().split() if (tmp_path / "child-state").exists() else []
    assert not state or state[2] == "Z", f"the setup's setsid child was still running when the task ran: {state}"
    assert not pid_files("child")


def test_a_child_that_ignores_term_does_not_outlive_the_setup_timeout(tmp_path, run_id, pid_files):
    setup = "sh -c \"trap '' TERM; exec sleep 1000\" & echo $! > child.pid; echo waiting; sleep 1000"
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--grace-period", "1", "--setup", setup,
                    "--setup-timeout", "3", "--", "true", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "setup failed on 127.0.0.1: did not finish within 3 s" in done.stderr
    assert (tmp_path / "child.pid").exists()
    assert not pid_files("child"), "a setup child that ignores SIGTERM outlived the timeout"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_to_mgpu_during_the_setup_stops_the_setup_and_all_it_started(tmp_path, run_id, pid_files, signum):
    # One child in the setup's group, one that left it (setsid) and ignores TERM.
    setup = ("sleep 1000 & echo $! > child.pid; "
             "setsid sh -c \"trap '' TERM; exec sleep 1000\" & echo $! > own-session.pid; echo started; wait")
    proc = start_mgpu("launch", "--local", "1", "--run-id", run_id, "--grace-period", "1", "--setup", setup,
                      "--", "touch", "started", cwd=tmp_path)
    try:
        wait_for(lambda: pid_files("child") and pid_files("own-session"), 60, "the setup's children")
        proc.send_signal(signum)
        code, out = finish(proc, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 128 + signum, out
    assert f"mgpu: error: interrupted by signal {signum}" in out
    assert not pid_files("child") and not pid_files("own-session"), "the setup's children outlived mgpu"
    assert not (tmp_path / "started").exists()


def test_a_setup_outlives_no_sigkilled_mgpu(tmp_path, run_id, pid_files):
    setup = "sleep 1000 & echo $! > child.pid; echo $$ > setup.pid; wait"
    proc = start_mgpu("launch", "--local", "1", "--run-id", run_id, "--grace-period", "1", "--setup", setup,
                      "--", "true", cwd=tmp_path)
    try:
        wait_for(lambda: pid_files("child") and pid_files("setup"), 60, "the setup and its child")
        proc.kill()
        proc.communicate(timeout=30)
        # The setup's guard (a reaper of its own) stops them once mgpu is gone.
        wait_for(lambda: not pid_files("child") and not pid_files("setup"), 30, "the setup and its child to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    wait_for_line(tmp_path / "mgpu-runs" / run_id / "reaper.log", "launcher gone", 30)


# -- what a setup prints -------------------------------------------------------------------------


def test_setup_output_is_escaped_on_the_console_and_exact_in_its_log(tmp_path, run_id):
    printed = b"plain\r\x1b[2Kmgpu: error: forged\n\x1b]0;title\x07bell\nlast\x1b[1A\r"
    (tmp_path / "printed").write_bytes(printed)
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--setup", "cat printed; exit 4",
                    "--", "true", cwd=tmp_path, text=False)
    assert done.returncode == 1, done.stdout + done.stderr
    for control in (b"\x1b", b"\r", b"\x07"):
        assert control not in done.stdout and control not in done.stderr
    # Each line a setup prints is its own on the console: none begins as mgpu's.
    assert all(line.startswith(b"[setup 127.0.0.1] ") for line in done.stdout.splitlines()), done.stdout
    assert b"[setup 127.0.0.1] \\x1b[2Kmgpu: error: forged" in done.stdout  # what the \r left shown
    assert b"[setup 127.0.0.1] \\x1b]0;title\\x07bell" in done.stdout
    # The error's last lines are escaped too, and the log keeps every byte.
    assert done.stderr.startswith(b"mgpu: error: setup failed on 127.0.0.1: exit code 4"), done.stderr
    assert b"\n  \\x1b]0;title\\x07bell\n" in done.stderr
    assert (tmp_path / "mgpu-runs" / run_id / "setup-127.0.0.1.log").read_bytes() == printed


def peak_rss_mb(args: list[str], cwd: pathlib.Path) -> tuple[float, subprocess.CompletedProcess]:
    """(mgpu's peak resident memory in MB, how it ended), measured by a process of its own whose
    only child is mgpu (the largest of mgpu and every process it waited for)."""
    measure = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode)")
    done = subprocess.run([sys.executable, "-c", measure, *MGPU, *args], cwd=cwd, env=mgpu_env(),
                          capture_output=True, text=True, timeout=100)
    kib, code = done.stdout.split()
    return int(kib) / 1024, subprocess.CompletedProcess(args, int(code), "", done.stderr)


def test_a_100_mb_setup_line_without_a_newline_keeps_mgpu_small_and_its_log_whole(tmp_path, run_id):
    size = 100_000_000
    setup = f"head -c {size} /dev/zero | tr '\\0' x"
    small, done = peak_rss_mb(["launch", "--local", "1", "--run-id", run_id + "-small", "--setup", "echo small",
                               "--", "true"], tmp_path)
    assert done.returncode == 0, done.stderr
    large, done = peak_rss_mb(["launch", "--local", "1", "--run-id", run_id, "--setup", setup, "--", "true"],
                              tmp_path)
    assert done.returncode == 0, done.stderr
    # Read in pieces: the test keeps to its own bound as well.
    with open(tmp_path / "mgpu-runs" / run_id / "setup-127.0.0.1.log", "rb") as log:
        total = 0
        while piece := log.read(1 << 20):
            assert piece == b"x" * len(piece)
            total += len(piece)
    assert total == size
    assert large - small < 50, f"peak {large:.0f} MB with a 100 MB line, {small:.0f} MB without"


def test_a_console_that_does_not_read_does_not_hold_the_setup_up(tmp_path, run_id):
    # Far more than a pipe holds, in lines; nobody reads mgpu's standard output until the task ran.
    setup = "i=0; while [ $i -lt 20000 ]; do echo line $i of the setup output; i=$((i+1)); done"
    with open(tmp_path / "stderr", "w") as stderr:
        proc = start_mgpu("launch", "--local", "1", "--run-id", run_id, "--setup", setup, "--setup-timeout", "100",
                          "--", "touch", "started", cwd=tmp_path, stderr=stderr)
        try:
            wait_for(lambda: (tmp_path / "started").exists() or proc.poll() is not None, 90, "the task to start")
            assert (tmp_path / "started").exists(), (tmp_path / "stderr").read_text()
            code, out = finish(proc, 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert code == 0, (tmp_path / "stderr").read_text()
    assert "[setup 127.0.0.1] line 0 of the setup output" in out
    log = (tmp_path / "mgpu-runs" / run_id / "setup-127.0.0.1.log").read_text().splitlines()
    assert log == [f"line {i} of the setup output" for i in range(20000)]
