"""Real training runs: real TensorFlow processes, a real 2-worker cluster on 127.0.0.1.

The small model on synthetic data with one thread per process is exactly reproducible,
which the resume and equivalence checks rely on.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest
from needs import installed_version, require, stand_in

np = require("numpy", "the train extra")
installed_version("tensorflow", "the train extra")

from launcher import protocol  # noqa: E402
from launching import REPO, wait_for
from trainer_helpers import FAST, Trainer, cluster_configs, read_json, wait_all

pytestmark = pytest.mark.slow

STEPS = 200
BATCH = 64  # global batch of the reference runs
RUN = [*FAST, "--train-steps", str(STEPS), "--log-every", "50", "--eval-every", "100"]
# Weights after 200 Adam steps of 2 workers x 32 vs 1 worker x 64 differed by 3e-5 at
# most (float sums in another order); weights are of order 0.5.
EQUIVALENCE_ATOL = 1e-4
PACED_TRAINER = REPO / "tests" / "programs" / "paced_trainer.py"


def checkpoint_weights(path: str) -> list[np.ndarray]:
    """The model weights in a checkpoint, read by the same code in this process."""
    import tensorflow as tf
    from launcher.trainer import models
    model = models.build("small")
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return model.get_weights()


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """One worker (global batch 64) with an evaluator sidecar and an export."""
    tmp = tmp_path_factory.mktemp("single")
    model_dir, export_dir, temporary = tmp / "model", tmp / "export", tmp / "tmp"
    temporary.mkdir()
    args = [*RUN, "--batch-size-per-replica", str(BATCH), "--model-dir", str(model_dir)]
    worker_config, evaluator_config = cluster_configs(1, evaluator=True)
    trainer = Trainer([*args, "--export-dir", str(export_dir)], tmp / "worker.log", worker_config,
                      python_options=("-X", "importtime"),
                      env={"TMPDIR": str(temporary), "PYTHONPATH": stand_in(tmp, "matplotlib", tmp / "matplotlib-loaded", submodules=["pyplot"])})
    evaluator = Trainer([*args, "--evaluator-timeout", "120"], tmp / "evaluator.log", evaluator_config,
                        env={"TMPDIR": str(temporary)})
    codes = wait_all([trainer, evaluator], timeout=240)
    return {"dir": tmp, "model_dir": model_dir, "export_dir": export_dir, "codes": codes,
            "trainer": trainer, "evaluator": evaluator, "temporary": temporary,
            "matplotlib_loaded": tmp / "matplotlib-loaded"}


@pytest.fixture(scope="module")
def two_worker_run(tmp_path_factory):
    """Two workers of 32 examples each: the same global batch as single_run.

    The exchange is pinned to a float32 all-reduce: `auto` picks int8 factors for this
    model, whose rounding moves the weights by about 2e-3 over 200 steps."""
    tmp = tmp_path_factory.mktemp("two")
    model_dir = tmp / "model"
    args = [*RUN, "--batch-size-per-replica", str(BATCH // 2), "--model-dir", str(model_dir),
            "--gradient-exchange", "allreduce"]
    trainers = [Trainer(args, tmp / f"worker{i}.log", config)
                for i, config in enumerate(cluster_configs(2))]
    codes = wait_all(trainers, timeout=240)
    return {"model_dir": model_dir, "codes": codes, "trainers": trainers}


@pytest.fixture(scope="module")
def two_worker_factored_run(tmp_path_factory):
    """As two_worker_run, with both Dense kernels' gradients rebuilt from float32 factors."""
    tmp = tmp_path_factory.mktemp("two_factored")
    model_dir = tmp / "model"
    args = [*RUN, "--batch-size-per-replica", str(BATCH // 2), "--model-dir", str(model_dir),
            "--gradient-exchange", "factors", "--factor-dtype", "float32"]
    trainers = [Trainer(args, tmp / f"worker{i}.log", config)
                for i, config in enumerate(cluster_configs(2))]
    codes = wait_all(trainers, timeout=240)
    return {"model_dir": model_dir, "codes": codes, "trainers": trainers}


def test_one_process_learns_synthetic_data(single_run):
    trainer = single_run["trainer"]
    assert single_run["codes"][0] == 0, trainer.output()[-3000:]
    lines = trainer.lines()
    assert protocol.READY_LINE in lines
    train_lines = [line for line in lines if line.startswith("train step=")]
    assert len(train_lines) == STEPS // 50
    assert all(k in train_lines[-1] for k in ("loss=", "accuracy=", "examples/sec="))
    metrics = read_json(single_run["model_dir"] / "metrics.json")
    assert set(metrics) == {"loss", "accuracy", "global_step", "wall_time_s", "num_replicas",
                            "examples_per_sec", "replica_fingerprints"}
    assert metrics["accuracy"] >= 0.9
    assert metrics["global_step"] == STEPS and metrics["num_replicas"] == 1
    assert metrics["examples_per_sec"] > 0 and len(metrics["replica_fingerprints"]) == 1
    for kind in ("train", "eval", "evaluator"):
        events = list((single_run["model_dir"] / kind).glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 100, kind


def test_the_trainer_loads_neither_jax_nor_matplotlib(single_run, tmp_path):
    """TensorFlow's Lite converter would import JAX, and Keras's plots matplotlib (here a stand-in),
    at every start of every task; the trainer never uses them."""
    assert single_run["codes"][0] == 0
    imported = single_run["trainer"].imported()
    assert "tensorflow" in imported and "numpy" in imported  # the lines were read
    # A refused import leaves a line for the name asked for ("jax"); one that loads, a line for each
    # module of the package as well.
    assert not {name for name in imported if name.startswith(("jax.", "jaxlib"))}
    assert not single_run["matplotlib_loaded"].exists()
    # The stand-in is what an import of matplotlib finds in the trainer's environment.
    loaded = tmp_path / "loaded"
    subprocess.run([sys.executable, "-c", "import matplotlib.pyplot"], check=True,
                   env={**os.environ, "PYTHONPATH": stand_in(tmp_path, "matplotlib", loaded, submodules=["pyplot"])})
    assert loaded.exists()


def test_the_tasks_leave_nothing_in_the_temporary_folder(single_run):
    """TensorFlow's autograph writes a source file per converted function there and removes them
    at exit in a handler that the worker's os._exit skips: the trainer gives them a folder of
    its own, which it removes whichever way it leaves."""
    assert single_run["codes"] == [0, 0]
    assert sorted(path.name for path in single_run["temporary"].iterdir()) == []


def test_evaluator_writes_results_for_the_final_checkpoint(single_run):
    evaluator = single_run["evaluator"]
    assert single_run["codes"][1] == 0, evaluator.output()[-3000:]
    results = read_json(single_run["model_dir"] / "eval_results.json")
    steps = [e["step"] for e in results["evaluations"]]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    assert results["final"]["checkpoint"] == f"ckpt-{STEPS}"
    assert results["final"]["accuracy"] >= 0.9


def test_exported_model_predicts_in_a_new_process(single_run):
    """Read back here, in the test's process, which never trained: the SavedModel stands alone."""
    assert single_run["codes"][0] == 0
    import tensorflow as tf
    from launcher.trainer.datasets import synthetic
    data = synthetic()
    model = tf.saved_model.load(str(single_run["export_dir"]))
    x = data.test_images[:500, :, :, None].astype("float32") / 255.0
    logits = model.serve(tf.constant(x)).numpy()
    accuracy = float((logits.argmax(-1) == data.test_labels[:500]).mean())
    assert accuracy >= 0.9


def test_two_workers_end_with_identical_fingerprints(two_worker_run):
    for trainer, code in zip(two_worker_run["trainers"], two_worker_run["codes"]):
        assert code == 0, trainer.output()[-3000:]
        assert protocol.READY_LINE in trainer.lines()
    metrics = read_json(two_worker_run["model_dir"] / "metrics.json")
    assert metrics["num_replicas"] == 2 and metrics["global_step"] == STEPS
    fingerprints = metrics["replica_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    # Only the chief logs progress.
    assert not [l for l in two_worker_run["trainers"][1].lines() if l.startswith("train step=")]


def test_two_workers_match_one_worker_with_double_batch(single_run, two_worker_run):
    assert single_run["codes"][0] == 0 and two_worker_run["codes"] == [0, 0]
    one = checkpoint_weights(str(single_run["model_dir"] / f"ckpt-{STEPS}"))
    two = checkpoint_weights(str(two_worker_run["model_dir"] / f"ckpt-{STEPS}"))
    initial = checkpoint_weights(str(single_run["model_dir"] / "ckpt-100"))
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=0, atol=EQUIVALENCE_ATOL)
    # The weights did move meanwhile, so the tolerance is a real constraint.
    assert max(np.abs(a - s).max() for a, s in zip(one, initial)) > 100 * EQUIVALENCE_ATOL


def test_two_workers_with_float32_factors_match_one_worker_with_double_batch(
        single_run, two_worker_factored_run):
    run = two_worker_factored_run
    assert run["codes"] == [0, 0], [t.output()[-3000:] for t in run["trainers"]]
    assert "gradient exchange: factors float32 (dense 1352x32, 32x10)" in run["trainers"][0].output()
    metrics = read_json(run["model_dir"] / "metrics.json")
    assert metrics["replica_fingerprints"][0] == metrics["replica_fingerprints"][1]
    one = checkpoint_weights(str(single_run["model_dir"] / f"ckpt-{STEPS}"))
    two = checkpoint_weights(str(run["model_dir"] / f"ckpt-{STEPS}"))
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=0, atol=EQUIVALENCE_ATOL)


def recorded_step(model_dir: pathlib.Path) -> int | None:
    """The step of the newest checkpoint the state file records, None before the first."""
    try:
        state = (model_dir / "checkpoint").read_text()
    except FileNotFoundError:
        return None
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.M)
    return int(match.group(1)) if match else None


def test_killed_run_resumes_to_the_same_weights_as_an_uninterrupted_one(single_run, tmp_path):
    """The uninterrupted run is single_run's worker: the same model, batch and data; how often a run
    logs, evaluates and saves changes nothing of its training."""
    assert single_run["codes"][0] == 0
    args = [*FAST, "--batch-size-per-replica", str(BATCH), "--log-every", "10", "--checkpoint-every", "10"]
    killed_dir = tmp_path / "killed"
    # Paced, 1 s after each checkpoint: it is killed long before it could train to the end.
    (tmp_path / "slow").touch()
    victim = Trainer([*args, "--train-steps", "100000", "--model-dir", str(killed_dir)],
                     tmp_path / "victim.log", program=(str(PACED_TRAINER), str(tmp_path)))
    try:
        # The state file stays (rewritten atomically) while checkpoint files come and go: a fast
        # trainer writes and deletes a checkpoint between two polls.
        wait_for(lambda: (recorded_step(killed_dir) or 0) >= 20, 180, "checkpoint 20 or later")
        victim.signal(signal.SIGKILL)
        victim.wait(30)
    finally:
        victim.close()
    # The newest complete checkpoint is the one the state file names: a kill may land
    # between writing a checkpoint's files and recording it.
    latest = recorded_step(killed_dir)

    resumed = Trainer([*args, "--train-steps", str(STEPS), "--model-dir", str(killed_dir)],
                      tmp_path / "resumed.log")
    assert resumed.wait(180) == 0, resumed.output()[-3000:]
    assert f"at step {latest}" in resumed.output()
    assert read_json(killed_dir / "metrics.json")["global_step"] == STEPS
    # Same step, same weights, same data order: the runs end identical.
    for a, b in zip(checkpoint_weights(str(killed_dir / f"ckpt-{STEPS}")),
                    checkpoint_weights(str(single_run["model_dir"] / f"ckpt-{STEPS}"))):
        np.testing.assert_array_equal(a, b)


def test_mixed_precision_and_xla_train(tmp_path):
    trainer = Trainer([*FAST, "--batch-size-per-replica", "64", "--train-steps", "20",
                       "--log-every", "10", "--mixed-precision", "mixed_float16", "--xla",
                       "--model-dir", str(tmp_path / "model")], tmp_path / "mixed.log")
    assert trainer.wait(180) == 0, trainer.output()[-3000:]
    assert "precision mixed_float16, xla True" in trainer.output()
    metrics = read_json(tmp_path / "model" / "metrics.json")
    assert np.isfinite(metrics["loss"]) and metrics["global_step"] == 20
