"""--setup on this machine: once before the tasks, never again on a restart, and a setup that
outlives --setup-timeout stops the launch before any task starts."""

from __future__ import annotations

import json

import pytest

from launching import run_mgpu

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
