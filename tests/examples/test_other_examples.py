"""examples/keras_custom_loop.py and examples/tf_config_reader.py under `mgpu launch --local`."""

import os
import subprocess
import sys

import pytest
from needs import stand_in

from launching import REPO, mgpu_env, run_mgpu


def launch(args, tmp_path, timeout=240, python_path=()):
    """`python_path`: folders the tasks search before the repository."""
    env = mgpu_env(HOME=str(tmp_path), PYTHONPATH=os.pathsep.join([*python_path, str(REPO)]))
    done = run_mgpu("launch", "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"), *args, cwd=tmp_path,
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return done.returncode, done.stdout


def test_tf_config_reader_gives_every_task_its_rank(tmp_path):
    code, out = launch(["--local", "2", "--chief", "--evaluator", "--", sys.executable,
                        str(REPO / "examples" / "tf_config_reader.py")], tmp_path)
    assert code == 0, out
    lines = sorted(line.split("; ")[0] for line in out.splitlines() if " reader: " in line)
    assert lines == ["[chief:0] reader: chief rank 0 of 3", "[evaluator:0] reader: evaluator rank None of 3",
                     "[worker:0] reader: worker rank 1 of 3", "[worker:1] reader: worker rank 2 of 3"]
    assert len({line.split("; ")[1] for line in out.splitlines() if " reader: " in line}) == 1  # one rank 0


@pytest.mark.slow
def test_keras_3_custom_loop_trains_on_two_workers_and_resumes(tmp_path):
    """The first run's tasks find a stand-in JAX that leaves a file when imported: TensorFlow would
    import it (its Lite converter), and the example keeps it out."""
    program = [sys.executable, str(REPO / "examples" / "keras_custom_loop.py"), "--model-dir", str(tmp_path / "m"),
               "--checkpoint-every", "10", "--log-every", "10"]
    jax_loaded = tmp_path / "jax-loaded"
    stand_ins = stand_in(tmp_path, "jax", jax_loaded, importable=False)
    code, out = launch(["--local", "2", "--", *program, "--steps", "20"], tmp_path, python_path=[stand_ins])
    assert code == 0, out[-3000:]
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] loop: step 20/20 loss" in out
    assert not jax_loaded.exists(), "a task imported jax"
    code, out = launch(["--local", "2", "--", *program, "--steps", "30"], tmp_path)
    assert code == 0, out[-3000:]
    assert "[worker:1] loop: resumed from" in out and "at step 20" in out
    assert "[worker:0] loop: finished at step 30" in out
