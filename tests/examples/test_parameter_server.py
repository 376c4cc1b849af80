"""TensorFlow's parameter-server training (the tutorial's tf_keras `model.fit` with
ParameterServerStrategy) under the real `mgpu launch`: a chief, 2 workers and a parameter server;
the run ends when the chief does, the servers stopped without that counting as a failure."""

import json
import pathlib
import secrets
import sys

import pytest
from needs import require

from launcher.host import proctree
from launching import REPO, finish, start_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_tutorials_model_fit_trains_and_the_run_is_the_chiefs(tmp_path):
    require("tf_keras")
    run_id = f"ps-{secrets.token_hex(4)}"
    # One thread per task, as on a shared host: the ps cluster still gets two inter-op threads.
    proc = start_mgpu("launch", "--local", "2", "--chief", "--ps", "1", "--legacy-keras", "--threads-per-task", "1",
                      "--log-dir", str(tmp_path / "runs"), "--run-id", run_id, "--",
                      sys.executable, str(REPO / "tests" / "programs" / "tf_parameter_server.py"), "3", cwd=tmp_path)
    try:
        code, out = finish(proc, 240)
    finally:
        for process in proctree.tagged_processes(run_id):
            process.kill()
    assert code == 0, out[-3000:]
    assert "[ps:0] ps:0 serving" in out and "[worker:1] worker:1 serving" in out, out[-3000:]
    assert "[chief:0] chief: trained 6 steps" in out and "variables on ['/job:ps/replica:0/task:0" in out, out[-3000:]
    assert "[mgpu] chief:0 ended; stopping the servers (worker:0, worker:1, ps:0)" in out, out[-3000:]
    assert "all 4 tasks ready" in out and "done: 4 tasks succeeded" in out, out[-3000:]
    record = json.loads(next(pathlib.Path(tmp_path / "runs").glob("*/run.json")).read_text())
    assert record["status"] == "succeeded"
    tasks = record["attempts"][-1]["tasks"]
    assert tasks["chief:0"]["exit_code"] == 0 and tasks["ps:0"]["ready_at"] is not None
    assert not list(proctree.tagged_processes(run_id))
