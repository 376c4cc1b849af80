"""A full disk under --log-dir (a small tmpfs the test mounts) with the real `mgpu launch`: mgpu's
own bookkeeping never stops or kills a task. It says once what it could not write, goes on
supervising, exits with the tasks' outcome, and keeps run.json whole: brought up to date once
there is space again, else its last complete version."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from launching import finish, run_mgpu, start_mgpu, wait_for, wait_for_line
from supervisor_helpers import FAKE_WORKER, recorded_ready

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"),
                                reason="mounting a small tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs of 400 inodes (a few runs' files; few enough to use up), unmounted at the end."""
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,nr_inodes=400,mode=0755", "tmpfs", str(path)], check=True, timeout=30)
    yield path
    if subprocess.run(["umount", str(path)], timeout=30).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


def fill(disk) -> None:
    """Take every free byte of `disk` with one file."""
    with open(disk / "filler", "wb", buffering=0) as f:  # unbuffered: no partial write left to flush at close
        try:
            for _ in range(10_000):  # 640 MB at most: the disk is far smaller
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        else:
            raise AssertionError(f"{disk} never filled up")


def run_json(run_dir) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def test_tasks_that_fill_the_log_disk_still_finish_and_mgpu_exits_with_their_outcome(small_disk, tmp_path, run_id):
    # Two tasks print 3 MB each onto a 2 MB disk.
    console = tmp_path / "console.txt"
    with open(console, "w") as out:
        proc = start_mgpu("launch", "--local", "2", "--log-dir", str(small_disk), "--run-id", run_id, "--",
                          *FAKE_WORKER, "--print-mb", "3", stdout=out)
        code, _ = finish(proc, timeout=240)
    text = console.read_text(errors="replace")
    mgpu_lines = [line for line in text.splitlines() if line.startswith(("[mgpu]", "mgpu:"))]
    assert code == 0, mgpu_lines
    assert "internal error" not in text
    for name in ("worker:0", "worker:1"):
        assert sum(f"cannot write the log of {name}:" in line for line in mgpu_lines) == 1, mgpu_lines
        assert f"[{name}] {name} printed 3.0 MB" in text  # both ran to their end
    assert sum("cannot write run.json" in line for line in mgpu_lines) <= 1, mgpu_lines
    run_dir = small_disk / run_id
    assert run_json(run_dir)["run_id"] == run_id  # whole: its last complete version at worst
    assert not (run_dir / "run.json.tmp").exists()


def test_run_json_is_brought_up_to_date_once_there_is_space_again(small_disk, tmp_path, run_id):
    # Each task ends when the test says so; the disk is full while worker:0 ends, then has room
    # again while worker:1 still runs.
    go = tmp_path / "go"
    go.mkdir()
    program = ("import os, pathlib, time\n"
               "print('MGPU_TASK_READY', flush=True)\n"
               f"mine = pathlib.Path({str(go)!r}) / os.environ['MGPU_TASK_INDEX']\n"
               "for _ in range(1200):\n"
               "    if mine.exists():\n"
               "        break\n"
               "    time.sleep(0.1)\n")
    console = tmp_path / "console.txt"
    run_dir = small_disk / run_id
    with open(console, "w") as out:
        proc = start_mgpu("launch", "--local", "2", "--log-dir", str(small_disk), "--run-id", run_id, "--",
                          sys.executable, "-c", program, stdout=out)
        try:
            wait_for(recorded_ready(run_dir, "worker:0", "worker:1"), 120, "both tasks ready in run.json")
            fill(small_disk)
            (go / "0").touch()
            wait_for_line(console, "cannot write run.json", 60, proc)
            assert proc.poll() is None and run_json(run_dir)["attempts"][0]["tasks"]["worker:0"]["ended_at"] is None
            (small_disk / "filler").unlink()

            def worker_0_ended():
                return run_json(run_dir)["attempts"][0]["tasks"]["worker:0"]["exit_code"] == 0

            wait_for(worker_0_ended, 60, "run.json to show worker:0's end")
            assert proc.poll() is None  # brought up to date while the run goes on
        finally:
            (go / "1").touch()
        code, _ = finish(proc, timeout=120)
    text = console.read_text(errors="replace")
    assert code == 0, text
    assert text.count("cannot write run.json") == 1, text
    record = run_json(run_dir)
    assert record["status"] == "succeeded"
    assert [record["attempts"][0]["tasks"][n]["exit_code"] for n in ("worker:0", "worker:1")] == [0, 0]
    assert not (run_dir / "run.json.tmp").exists()


def test_a_full_lock_folder_refuses_the_run_id_claim_in_one_line(small_disk, monkeypatch):
    # The folder's place is redirected (the machine's own is shared by every launch); the claim is mgpu's.
    from launcher.errors import UsageError
    from launcher.supervise import run_lock
    folder = small_disk / "locks"
    monkeypatch.setattr(run_lock, "run_id_lock_dir", lambda: str(folder))
    run_lock.claim_run_id("before")  # makes the folder
    run_lock.release_run_id("before")
    fill(small_disk)
    with pytest.raises(UsageError, match=f"^{folder}: cannot lock run id full-1 there: No space left on device "):
        run_lock.claim_run_id("full-1")
    assert not run_lock.is_claimed("full-1") and list(folder.iterdir()) == []
    for i in range(100_000):  # then no inode left either: the lock file cannot even be made
        try:
            (small_disk / f"inode-{i}").touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            break
    else:
        raise AssertionError(f"{small_disk} never ran out of inodes")
    with pytest.raises(UsageError, match=f"^{folder}: cannot lock run id full-2 there: No space left on device "):
        run_lock.claim_run_id("full-2")


def test_a_run_stopped_while_its_disk_is_full_is_recorded_as_it_ended(small_disk, tmp_path, run_id):
    # run.json cannot take the run's end; `mgpu stop` and `mgpu status` still say how it ended.
    program = "import time\nprint('MGPU_TASK_READY', flush=True)\ntime.sleep(120)\n"
    run_dir = small_disk / run_id
    with open(tmp_path / "console.txt", "w") as out:
        proc = start_mgpu("launch", "--local", "1", "--log-dir", str(small_disk), "--run-id", run_id, "--",
                          sys.executable, "-c", program, stdout=out)
        try:
            wait_for(recorded_ready(run_dir, "worker:0"), 120, "the task ready in run.json")
            fill(small_disk)
            stop = run_mgpu("stop", run_id, "--log-dir", str(small_disk), timeout=120)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        code, _ = finish(proc, timeout=120)
    assert code == 143
    assert stop.returncode == 0 and f"mgpu: run {run_id} interrupted (exit 143)" in stop.stdout, stop
    assert run_json(run_dir)["status"] == "running"  # its last complete version: the end did not fit
    status = run_mgpu("status", run_id, "--log-dir", str(small_disk), "--json")
    shown = json.loads(status.stdout)
    assert (shown["state"], shown["exit_code"], shown["message"]) == ("interrupted", 143, "interrupted by signal 15")
    assert "interrupted" in run_mgpu("status", "--log-dir", str(small_disk)).stdout


def test_a_launcher_killed_while_its_disk_is_full_is_recorded_by_its_reaper(small_disk, tmp_path, run_id):
    program = "import time\nprint('MGPU_TASK_READY', flush=True)\ntime.sleep(120)\n"
    run_dir = small_disk / run_id
    with open(tmp_path / "console.txt", "w") as out:
        proc = start_mgpu("launch", "--local", "1", "--log-dir", str(small_disk), "--run-id", run_id,
                          "--grace-period", "1", "--", sys.executable, "-c", program, stdout=out)
        try:
            wait_for(recorded_ready(run_dir, "worker:0"), 120, "the task ready in run.json")
            fill(small_disk)
        finally:
            proc.kill()
        finish(proc, timeout=60)

    def recorded_end():
        return json.loads(run_mgpu("status", run_id, "--log-dir", str(small_disk), "--json").stdout)["message"]

    message = wait_for(recorded_end, 60, "the reaper's record of the end", interval=0.2)
    assert message.startswith("the launcher died before the run ended; its reaper stopped 1 processes"), message
    assert run_json(run_dir)["status"] == "running"
