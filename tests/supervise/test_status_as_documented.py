"""`mgpu status` shows what docs/long-runs.md says it shows: the columns of the run list, and a run's
state, exit code and task table with the header the page prints."""

import re
import sys

import pytest

from launching import REPO, run_mgpu

pytestmark = pytest.mark.timeout(120)

PAGE = REPO / "docs" / "long-runs.md"
PROGRAM = "print('MGPU_PROGRESS 5/10', flush=True); print('last words', flush=True)"


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_status_shows_the_columns_and_the_task_table_the_page_lists(run_id, tmp_path):
    done = run_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(tmp_path), "--",
                    sys.executable, "-c", PROGRAM)
    assert done.returncode == 0, done.stderr
    page = PAGE.read_text()

    listed = run_mgpu("status", "--log-dir", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    # "one line per run with its id, state, start time, tasks, hosts, restarts and progress"
    assert "one line per run with its id, state, start time, tasks, hosts, restarts and\nprogress" in page
    assert columns(header) == ["RUN", "STATE", "STARTED (UTC)", "TASKS", "HOSTS", "RESTARTS", "PROGRESS"]
    cells = columns(row)
    assert cells[0] == run_id and cells[1] == "succeeded" and cells[3:6] == ["2", "127.0.0.1", "0"]
    assert cells[6].startswith("5/10")

    one = run_mgpu("status", run_id, "--log-dir", str(tmp_path))
    assert one.returncode == 0, one.stderr
    lines = one.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}: succeeded (exit 0); ")  # "the run's state and exit code"
    assert "; 0 restarts; " in lines[0], lines[0]
    documented = next(line for line in page.splitlines() if line.startswith("TASK "))
    table = next(line for line in lines if line.startswith("TASK "))
    assert columns(table) == columns(documented)  # host, pid, state, ready, progress, busy, last line
    for name in ("worker:0", "worker:1"):
        row = columns(next(line for line in lines if line.startswith(name + " ")))
        assert row[1] == "127.0.0.1" and row[2].isdigit() and row[3] == "exit 0"
        assert re.fullmatch(r"\d\d:\d\d:\d\d", row[4]) and row[5].startswith("5/10") and row[-1] == "last words"
    # "the run's costs ... in the closing line's words"
    assert "the run's costs: its goodput and the time lost by cause, in the closing line's words" in \
        " ".join(page.split())
    costs = next(line for line in lines if line.startswith("costs: "))[len("costs: "):]
    assert costs.startswith("goodput ")
    closing = next(line for line in (done.stdout + done.stderr).splitlines() if "] done: " in line)
    assert f"; {costs}; logs and run.json in " in closing, (costs, closing)
