"""How `mgpu status`, `logs`, `attach` and `stop` find runs and read them, on run.json files
written by hand; and the progress each task's record gets, with a clock moved by hand."""

import json
import os
import socket

import pytest

from launcher.errors import UsageError
from launcher.supervise import run_lock, runs
from launcher.supervise.watchers import Line, ProgressWatcher


def write_run(log_dir, run_id, started, **record):
    folder = log_dir / run_id
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": run_id, "status": "succeeded", "started_at": started,
                                                 "supervisor_host": socket.gethostname(), **record}))


def test_a_run_is_found_by_its_id_a_unique_start_of_it_or_last(tmp_path):
    write_run(tmp_path, "20260101-a1", "2026-01-01T00:00:00")
    write_run(tmp_path, "20260102-b1", "2026-01-02T00:00:00")
    write_run(tmp_path, "20260102-b2", "2026-01-02T01:00:00")
    (tmp_path / "not-a-run").mkdir()
    assert [run.run_id for run in runs.runs(tmp_path)] == ["20260102-b2", "20260102-b1", "20260101-a1"]
    assert runs.find(tmp_path, "last").run_id == "20260102-b2"
    assert runs.find(tmp_path, "20260101").run_id == "20260101-a1"
    assert runs.find(tmp_path, "20260102-b1").run_id == "20260102-b1"
    with pytest.raises(UsageError, match="is the start of 2 runs"):
        runs.find(tmp_path, "20260102")
    with pytest.raises(UsageError, match="no run 'nope' of yours"):
        runs.find(tmp_path, "nope")
    with pytest.raises(UsageError, match="no runs in"):
        runs.find(tmp_path / "empty", "last")


def test_a_running_record_is_believed_only_with_the_lock_held_by_its_supervisor(tmp_path):
    run_id = f"runs-test-{os.getpid()}"
    write_run(tmp_path, run_id, "2026-01-01T00:00:00", status="running", supervisor_pid=os.getpid())
    run = runs.find(tmp_path, run_id)
    assert not run.supervised() and run.state == "launcher-died" and run.exit_code == 1
    with run_lock.claimed(run_id):
        assert run_lock.holder(run_id) == os.getpid()
        assert run.supervised() and run.state == "running"
        (tmp_path / run_id / "run.json").write_text(json.dumps({**run.record, "supervisor_pid": 1}))
        assert runs.find(tmp_path, run_id).state == "launcher-died"  # a pid in a file is not enough
    assert run_lock.holder(run_id) is None


def test_a_run_supervised_on_another_machine_is_as_its_record_says(tmp_path):
    write_run(tmp_path, "elsewhere", "2026-01-01T00:00:00", status="running", supervisor_pid=1,
              supervisor_host="another-machine.invalid")
    run = runs.find(tmp_path, "elsewhere")
    assert not run.here and run.state == "running" and run.supervised()


def test_progress_has_a_rate_and_the_time_left_and_the_last_line_is_not_a_progress_line():
    now = [100.0]
    watcher = ProgressWatcher(lambda: now[0])
    assert watcher.snapshot() == (None, None)
    watcher.line(Line(b"", "epoch 1", True))
    watcher.line(Line(b"", "MGPU_PROGRESS 10/110", True))
    now[0] = 110.0
    watcher.line(Line(b"", "MGPU_PROGRESS 60/110", True))
    watcher.line(Line(b"", "MGPU_PROGRESS 70/110", False))  # not on stdout: an ordinary line
    last, progress = watcher.snapshot()
    assert last == "MGPU_PROGRESS 70/110"
    assert (progress["step"], progress["total"], progress["rate"], progress["eta_s"]) == (60, 110, 5.0, 10.0)


def test_tail_start_is_where_the_last_lines_begin(tmp_path):
    path = tmp_path / "console.log"
    path.write_bytes(b"one\ntwo\nthree\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert path.read_bytes()[runs.tail_start(fd, 2):] == b"two\nthree\n"
        assert runs.tail_start(fd, 10) == 0
    finally:
        os.close(fd)
    assert runs.open_log(runs.Run("r", tmp_path, {}), "missing") is None  # a console not there yet: from 0
