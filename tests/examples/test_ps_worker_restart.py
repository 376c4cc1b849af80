"""--worker-restarts under the real `mgpu launch` with TensorFlow's parameter-server training: a
worker lost while the chief trains is started again in place, in the same attempt, and the chief
(its ClusterCoordinator) and the ps task go on to the end of training, never restarted."""

import json
import pathlib
import secrets
import sys

import pytest
from needs import require

from launcher.host import proctree
from launching import REPO, finish, start_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_lost_worker_is_restarted_in_place_and_the_chief_trains_on(tmp_path):
    require("tf_keras")
    run_id = f"ps-restart-{secrets.token_hex(4)}"
    proc = start_mgpu("launch", "--local", "2", "--chief", "--ps", "1", "--legacy-keras", "--threads-per-task", "1",
                      "--worker-restarts", "1", "--log-dir", str(tmp_path / "runs"), "--run-id", run_id, "--",
                      sys.executable, str(REPO / "tests" / "programs" / "tf_ps_worker_lost.py"), str(tmp_path),
                      "3", "120", cwd=tmp_path)
    try:
        code, out = finish(proc, 240)
    finally:
        for process in proctree.tagged_processes(run_id):
            process.kill()
    assert code == 0, out[-3000:]
    assert ("[mgpu] worker:1 exited with code 3; restarting it in place, the chief and the ps tasks going on "
            "(worker restart 1 of 1)") in out, out[-3000:]
    assert out.count("[worker:1] worker:1 serving") == 2 and "[chief:0] chief: worker:1 back: True" in out, out[-3000:]
    assert "[chief:0] chief: trained 6 steps" in out and "done: 4 tasks succeeded" in out and ", no restarts of the cluster; 1 worker restart in place; logs" in out, out[-3000:]
    record = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
    assert record["status"] == "succeeded" and len(record["attempts"]) == 1
    tasks = record["attempts"][0]["tasks"]
    assert tasks["worker:1"]["restarts_in_place"] == 1
    assert all("restarts_in_place" not in tasks[name] for name in ("chief:0", "ps:0", "worker:0"))
    assert record["options"]["worker_restarts"] == 1
    assert not list(proctree.tagged_processes(run_id))
