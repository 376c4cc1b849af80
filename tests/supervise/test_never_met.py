"""A run whose tasks all exit 0 before any is seen joining its cluster, and that reports no
progress, succeeds with a warning on the console and in run.json (a program that found no GPU and
exited 0 on every task looks so); one whose tasks met, or that reported progress, has none."""

import json
import sys

import pytest

from launching import run_mgpu
from supervisor_helpers import FAKE_WORKER

pytestmark = pytest.mark.timeout(120)

WARNING = "no task was seen joining its cluster or reporting progress before it ended; check in its logs that it trained"


def launched(run_id, tmp_path, *command):
    done = run_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(tmp_path), "--", *command)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr, json.loads((tmp_path / run_id / "run.json").read_text())


def test_tasks_that_never_met_succeed_with_a_warning(run_id, tmp_path):
    console, record = launched(run_id, tmp_path, sys.executable, "-c", "print('Unable to locate sufficient 2 gpus')")
    assert f"[mgpu] warning: {WARNING}" in console, console
    assert record["status"] == "succeeded" and record["warnings"] == [WARNING]


@pytest.mark.parametrize("how", ["met", "progress"])
def test_tasks_that_met_or_reported_progress_have_no_warning(run_id, tmp_path, how):
    if how == "met":  # each listens on its own port for a moment: the supervisor sees it join
        command = (*FAKE_WORKER, "--bind", "--sleep", "3")
    else:
        command = (sys.executable, "-c", "print('MGPU_PROGRESS 1/1', flush=True)")
    console, record = launched(run_id, tmp_path, *command)
    assert "warning" not in console, console
    assert "warnings" not in record
