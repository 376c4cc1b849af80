"""TensorFlow's parameter-server training (the tutorial's tf_keras `model.fit` with
ParameterServerStrategy) under the real `mgpu launch`: a chief, 2 workers and a parameter server;
the run ends when the chief does, the servers stopped without that counting as a failure. With
--worker-restarts, a worker lost while the chief trains is started again in place, in the same
attempt, and the chief (its ClusterCoordinator) and the ps task go on to the end of training,
never restarted.

One launch for both: four TensorFlow tasks are some twenty CPU-seconds here, and the run that
loses a worker shows everything the run that does not lose one does."""

import json
import secrets
import sys

import pytest
from needs import require

from launcher.host import proctree
from launching import REPO, finish, start_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(exit code, console, run.json, run id) of the launch in which worker:1 is lost after the chief's
    first epoch."""
    require("tf_keras")
    tmp_path = tmp_path_factory.mktemp("ps")
    run_id = f"ps-{secrets.token_hex(4)}"
    # One thread per task, as on a shared host: the ps cluster still gets two inter-op threads.
    proc = start_mgpu("launch", "--local", "2", "--chief", "--ps", "1", "--legacy-keras", "--threads-per-task", "1",
                      "--worker-restarts", "1", "--log-dir", str(tmp_path / "runs"), "--run-id", run_id, "--",
                      sys.executable, str(REPO / "tests" / "programs" / "tf_parameter_server.py"), "3", str(tmp_path),
                      "120", cwd=tmp_path)
    try:
        code, out = finish(proc, 240)
    finally:
        for process in proctree.tagged_processes(run_id):
            process.kill()
    path = tmp_path / "runs" / run_id / "run.json"
    return code, out, json.loads(path.read_text()) if path.exists() else {}, run_id


def test_the_tutorials_model_fit_trains_and_the_run_is_the_chiefs(run):
    code, out, record, run_id = run
    assert code == 0, out[-3000:]
    assert "[ps:0] ps:0 serving" in out and "[worker:1] worker:1 serving" in out, out[-3000:]
    assert "[chief:0] chief: trained 6 steps" in out and "variables on ['/job:ps/replica:0/task:0" in out, out[-3000:]
    assert "[mgpu] chief:0 ended; stopping the servers (worker:0, worker:1, ps:0)" in out, out[-3000:]
    assert "all 4 tasks ready" in out and "done: 4 tasks succeeded" in out, out[-3000:]
    assert record["status"] == "succeeded"
    tasks = record["attempts"][-1]["tasks"]
    assert tasks["chief:0"]["exit_code"] == 0 and tasks["ps:0"]["ready_at"] is not None
    assert not list(proctree.tagged_processes(run_id))


def test_a_lost_worker_is_restarted_in_place_and_the_chief_trains_on(run):
    code, out, record, _ = run
    assert code == 0, out[-3000:]
    assert ("[mgpu] worker:1 exited with code 3; restarting it in place, the chief and the ps tasks going on "
            "(worker restart 1 of 1)") in out, out[-3000:]
    assert out.count("[worker:1] worker:1 serving") == 2 and "[chief:0] chief: worker:1 back: True" in out, out[-3000:]
    assert "[chief:0] chief: trained 6 steps" in out and "done: 4 tasks succeeded" in out and ", no restarts of the cluster; 1 worker restart in place; logs" in out, out[-3000:]
    assert record["status"] == "succeeded" and len(record["attempts"]) == 1
    tasks = record["attempts"][0]["tasks"]
    assert tasks["worker:1"]["restarts_in_place"] == 1
    assert all("restarts_in_place" not in tasks[name] for name in ("chief:0", "ps:0", "worker:0"))
    assert record["options"]["worker_restarts"] == 1
