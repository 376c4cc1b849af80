"""A run id is one run on the whole machine, whatever the log dir: the end of a run stops every
process of this user that carries its id, so two runs with one id would stop each other's tasks."""

import json
import os
import pathlib
import secrets
import signal
import subprocess
import sys

from launcher.supervise.run_lock import run_id_lock_dir
from launching import mgpu_env, run_mgpu, start_mgpu, wait_for

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


# Picks two ports as a launch of `--local 2` does (claimed for as long as it runs), prints them, and
# keeps them until its stdin closes.
PICKER = ("import os, sys\nfrom launcher.host.ports import pick_free_ports\nfrom launcher.supervise.run_lock import claim_port\n"
          "os.write(1, ('%d %d\\n' % tuple(pick_free_ports(2, claim=claim_port))).encode())\nsys.stdin.read()\n")


def start_picker() -> tuple[subprocess.Popen, list[pathlib.Path]]:
    picker = subprocess.Popen([sys.executable, "-c", PICKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=mgpu_env())
    ports = picker.stdout.readline().split()  # it holds them now
    assert len(ports) == 2, ports
    return picker, [pathlib.Path(run_id_lock_dir(), f"port:{port}.lock") for port in ports]


def test_port_locks_go_with_their_run_and_stale_ones_with_the_next_launch(tmp_path):
    first, first_locks = start_picker()
    second, second_locks = None, []
    try:
        second, second_locks = start_picker()  # its sweep leaves the locks of a live launch
        assert all(lock.exists() for lock in first_locks + second_locks)
        first.kill()  # a launch that dies leaves its files: the kernel drops only the locks
        first.wait()
        assert all(lock.exists() for lock in first_locks)
        third, third_locks = start_picker()  # the next launch's sweep removes them, and only them
        third.communicate(timeout=30)
        assert not any(lock.exists() for lock in first_locks)
        assert all(lock.exists() for lock in second_locks)
    finally:
        for picker in (first, second):
            if picker is not None and picker.poll() is None:
                picker.communicate(timeout=30)
    # A run gives its ports' locks up with its run id's at its end.
    run_id = f"ports-{secrets.token_hex(4)}"
    done = run_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(tmp_path), "--", "true")
    assert done.returncode == 0, done.stderr
    ports = [plan["port"] for plan in json.loads((tmp_path / run_id / "run.json").read_text())["plans"]]
    assert len(ports) == 2 and not [port for port in ports if os.path.exists(f"{run_id_lock_dir()}/port:{port}.lock")]


# Claims one port given on its command line, says whether it got it, and holds it until stdin closes.
CLAIMER = ("import sys\nfrom launcher.supervise.run_lock import claim_port\n"
           "print(claim_port(int(sys.argv[1])), flush=True)\nsys.stdin.read()\n")


def claimer(port: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", CLAIMER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=mgpu_env())
    return proc, proc.stdout.readline().strip()


def test_a_port_one_launch_claims_is_refused_to_another_until_the_first_ends():
    port = 20000 + secrets.randbelow(10000)
    first, got = claimer(port)
    try:
        assert got == "True"
        second, refused = claimer(port)
        second.communicate(timeout=30)
        assert refused == "False"
    finally:
        first.communicate(timeout=30)
    third, got_again = claimer(port)  # the first's claim went with it
    third.communicate(timeout=30)
    assert got_again == "True"


def test_a_port_whose_claim_cannot_be_made_is_not_handed_out():
    port = 20000 + secrets.randbelow(10000)
    blocker = pathlib.Path(run_id_lock_dir(), f"port:{port}.lock")
    blocker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    blocker.mkdir()  # the lock file cannot be opened where a folder has its name
    try:
        proc, got = claimer(port)
        proc.communicate(timeout=30)
        assert got == "False"
    finally:
        blocker.rmdir()
