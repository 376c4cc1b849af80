"""examples/keras_fit_legacy.py under `mgpu launch`: Keras 3 fit fails with a hint, tf_keras fit
trains on 2 workers, and BackupAndRestore resumes after a worker is killed."""

import json
import os
import pathlib
import signal
import sys

import psutil
import pytest
from needs import installed_version, stand_in

from launching import REPO, finish, mgpu_env, per_attempt, start_mgpu, wait_for_line

pytestmark = pytest.mark.slow
installed_version("tensorflow", "the train extra")
installed_version("tf-keras", "the legacy-keras extra")

EXAMPLE = str(REPO / "examples" / "keras_fit_legacy.py")
PACED_EXAMPLE = REPO / "tests" / "programs" / "paced_keras_fit.py"


def launch(args, tmp_path, python_path=()):
    """`mgpu launch` with HOME in tmp_path (tf_keras keeps its settings in ~/.keras) and this Python's
    folder first on PATH, as in an activated virtual environment: the host check of a program run
    through a shell asks `python3` for tf_keras. `python_path`: folders searched before the repository."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = mgpu_env(HOME=str(home), PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   PYTHONPATH=os.pathsep.join([*python_path, str(REPO)]))
    env.pop("TF_USE_LEGACY_KERAS", None)
    return start_mgpu("launch", "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"), *args, cwd=tmp_path,
                      env=env)


def fit_command(model_dir, *args):
    return ["--", sys.executable, EXAMPLE, "--model-dir", str(model_dir), *args]


def test_legacy_keras_fit_trains_a_chief_and_a_worker_with_keras_progress_bar(tmp_path):
    # Two workers without a chief train (and worker 0 saves) in the kill -9 test below. The tasks find
    # a stand-in JAX that leaves a file when imported: TensorFlow would import it, the example does not.
    model_dir = tmp_path / "model"
    jax_loaded = tmp_path / "jax-loaded"
    stand_ins = stand_in(tmp_path, "jax", jax_loaded, importable=False)
    code, out = finish(launch(["--local", "1", "--chief", "--legacy-keras", "--run-id", "chief",
                               *fit_command(model_dir, "--epochs", "2", "--steps-per-epoch", "4", "--verbose", "1")],
                              tmp_path, python_path=[stand_ins]), 300)
    assert code == 0, out[-3000:]
    assert not jax_loaded.exists(), "a task imported jax"
    for task in ("chief:0", "worker:0"):
        assert f"[{task}] fit: tf_keras 2." in out
        assert f"[{task}] fit: epoch 2 done" in out
    assert "[chief:0] fit: model saved to" in out and (model_dir / "model" / "saved_model.pb").exists()
    record = json.loads((tmp_path / "runs" / "chief" / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert {plan["env"]["TF_USE_LEGACY_KERAS"] for plan in record["plans"]} == {"1"}
    # Keras redraws its bar with \r and backspaces: the console gets its final state as one clean line.
    assert "\r" not in out and "\b" not in out
    assert [line for line in out.splitlines() if line.startswith("[chief:0] 4/4 [====")]
    assert "\r" in (tmp_path / "runs" / "chief" / "chief-0.log").read_bytes().decode()


def test_backup_and_restore_resumes_after_kill_9_of_a_worker(tmp_path):
    model_dir, run_dir = tmp_path / "model", tmp_path / "runs" / "resume"
    # The first attempt pauses 2 s after each epoch's backup (tests/programs/paced_keras_fit.py): the
    # kill reaches it seconds after its second epoch, before more than a few others end, and the
    # restart has some of its 8 epochs left to resume.
    first_epochs, epochs = 40, 8
    program = [sys.executable, str(PACED_EXAMPLE), "2", "--model-dir", str(model_dir), "--steps-per-epoch", "5"]
    proc = launch(["--local", "2", "--legacy-keras", "--run-id", "resume", "--max-restarts", "1", "--grace-period", "2",
                   "--", *per_attempt(program, "--epochs", first_epochs, epochs)], tmp_path)
    try:
        wait_for_line(run_dir / "worker-0.log", "fit: epoch 2 done", 180, proc)
        record = json.loads((run_dir / "run.json").read_text())
        psutil.Process(record["attempts"][0]["tasks"]["worker:1"]["pid"]).send_signal(signal.SIGKILL)
    finally:
        code, out = finish(proc, 300)
    assert code == 0, out[-3000:]
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert len(attempts) == 2
    assert attempts[0]["tasks"]["worker:1"]["signal"] == "SIGKILL"
    # The second attempt starts after the last epoch the first one backed up, and finishes.
    log = (run_dir / "worker-0.log").read_text(errors="replace")
    first, second = log.split("----- mgpu: attempt 2 started")
    done_before = max(int(line.split()[2]) for line in first.splitlines() if line.startswith("fit: epoch "))
    assert done_before < first_epochs, "the kill came after training had finished"
    resumed_at = int(second.split("fit: starting at epoch ")[1].split()[0])
    assert 3 <= resumed_at <= min(done_before + 1, epochs)
    assert f"fit: epoch {epochs} done" in second and (model_dir / "model" / "saved_model.pb").exists()


def test_keras_3_fit_fails_with_a_hint(tmp_path):
    """Keras 3's model.fit under MultiWorkerMirroredStrategy (keras-team/keras#20585): the summary names the fix."""
    code, out = finish(launch(["--local", "2", *fit_command(tmp_path / "model", "--epochs", "1",
                                                            "--steps-per-epoch", "2")], tmp_path), 300)
    assert code == 1, out[-3000:]
    assert "fit: keras 3." in out
    # The summary gives Keras's error, not TensorFlow's start-up noise, and one hint.
    assert "  ValueError: Attempt to convert a value (PerReplica" in out, out[-3000:]
    hints = [line.strip() for line in out.splitlines() if line.strip().startswith("hint: ")]
    assert len(hints) == 1, hints
    # The fix stands alone: a pip user has no examples/ folder to be sent to.
    assert "--legacy-keras" in hints[0] and "KERAS_BACKEND=jax" in hints[0] and "examples/" not in hints[0]
    assert "keras-team/keras#20585" in hints[0]
