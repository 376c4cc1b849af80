"""The shared test helpers of launching.py: bounded waits that name what they waited for, and the
CLI run from this checkout."""

import subprocess
import sys

import pytest

from launching import REPO, mgpu_env, run_mgpu, wait_for, wait_for_line


def test_wait_for_returns_what_the_predicate_found():
    answers = iter([None, 0, "found"])
    assert wait_for(lambda: next(answers), 5, what="an answer", interval=0) == "found"


def test_wait_for_names_what_it_waited_for_when_the_time_is_up():
    with pytest.raises(AssertionError, match=r"timed out after 0.1 s waiting for the log tail: nothing yet"):
        wait_for(lambda: False, 0.1, what=lambda: "the log tail: nothing yet", interval=0.01)


def test_wait_for_line_stops_at_once_when_the_process_has_ended(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    with pytest.raises(AssertionError, match="never appeared in out.log: the process ended first"):
        wait_for_line(tmp_path / "out.log", "ready", 60, ended)
    (tmp_path / "out.log").write_text("x\nready\n")
    wait_for_line(tmp_path / "out.log", "ready", 60, ended)


def test_run_mgpu_runs_this_checkouts_cli(tmp_path):
    done = run_mgpu("tf-config", "--workers", "h1:2222", "--task-index", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    imported = subprocess.run([sys.executable, "-c", "import launcher; print(launcher.__file__)"], cwd=tmp_path,
                              env=mgpu_env(), capture_output=True, text=True, timeout=60)
    assert imported.stdout.strip().startswith(str(REPO / "launcher"))
