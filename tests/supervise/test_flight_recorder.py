"""PyTorch's flight recorder on a stall, with real processes: a 2-rank gloo DDP job (CPU, a tiny
model, torch's worker server) whose rank 1 blocks in Python mid-training is stopped as stalled,
rank 1 named by the recorder's verdict (which torch's analyzer gives on the dumps each rank's
worker server answered) and by py-spy's stacks; nothing is left behind."""

import json
import pathlib
import sys
import tempfile

import needs
from launching import REPO, run_mgpu
from supervisor_helpers import assert_run_gone

PROGRAM = str(REPO / "tests" / "programs" / "torch_blocked_rank.py")


def test_a_rank_blocked_in_python_is_named_by_the_flight_recorder_and_py_spy(run_id):
    needs.installed_version("torch", "the train extra")
    needs.installed_version("py-spy")
    # A log dir of a short path, wherever the tests' temporary folders are: the worker server's
    # socket is in the run's folder, and a socket's path holds 107 bytes.
    with tempfile.TemporaryDirectory(prefix="mgpu-fr-", dir="/tmp") as short:
        check_the_stall(run_id, pathlib.Path(short) / "runs")


def check_the_stall(run_id, runs):
    done = run_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(runs), "--stall-timeout", "3",
                    "--grace-period", "2", "--", sys.executable, PROGRAM, "3", timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    report = done.stderr.split("mgpu: error: ")[1].splitlines()
    assert report[0].startswith("stall: no training task made progress") and "likely cause: worker:1" in report[0]
    assert "worker:0 on 127.0.0.1: waiting in torch" in report
    assert ("flight recorder: worker:1 (rank 1) did not join gloo:all_reduce #9 (process group 0:default_pg), "
            "scheduled on the others") in report, report
    run_dir = runs / run_id
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "stalled"
    assert record["attempts"][0]["flight_recorder"] == {"dumps": 2, "missing": [
        {"sequence": 9, "collective": "gloo:all_reduce", "group": "0:default_pg", "ranks": [1], "tasks": ["worker:1"],
         "state": "scheduled"}]}
    kept = run_dir / "stall-0" / "flight-recorder"
    assert sorted(p.name for p in kept.iterdir()) == ["analyzer.txt", "rank_0.json", "rank_1.json"]
    assert "missing ranks: {1}" in (kept / "analyzer.txt").read_text()
    assert "flight-recorder/" in (run_dir / "stall-0" / "README").read_text()
    # The dumps were asked for while the tasks ran: py-spy read them, no SIGABRT was needed.
    assert "SIGABRT" not in {t.get("signal") for t in record["attempts"][0]["tasks"].values()}
    assert not list(run_dir.glob("*.sock"))
    assert_run_gone(run_id)
