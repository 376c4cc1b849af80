"""Published programs that fail in a known way under `mgpu launch` get the hint that fixes them, and
the fix works: TensorFlow's custom-training tutorial, written for Keras 2, calls its metrics'
`reset_states()`, which Keras 3 lacks (tests/programs/keras2_metrics_loop.py); the hint points to
--legacy-keras, and with it the same program runs to its end."""

import sys

import pytest

import needs
from launching import REPO, run_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAM = str(REPO / "tests" / "programs" / "keras2_metrics_loop.py")


def test_a_keras2_metrics_loop_under_keras3_points_to_legacy_keras_which_runs_it(tmp_path, run_id):
    needs.installed_version("tensorflow")
    needs.installed_version("tf-keras", "the legacy-keras extra")
    runs = str(tmp_path / "runs")
    failed = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", runs,
                      "--", sys.executable, PROGRAM, timeout=240)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    summary = failed.stderr[failed.stderr.index("mgpu: error: "):].splitlines()
    assert summary[1].strip().startswith("AttributeError: 'SparseCategoricalAccuracy' object has no attribute "
                                         "'reset_states'"), summary
    [hint] = [line for line in summary if line.startswith("hint: ")]
    assert "--legacy-keras" in hint and "reset_state()" in hint, hint
    # What the hint says to do.
    fixed = run_mgpu("launch", "--local", "1", "--run-id", f"{run_id}-legacy", "--log-dir", runs, "--legacy-keras",
                     "--", sys.executable, PROGRAM, timeout=240)
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    assert "[worker:0] Epoch 2, Accuracy: " in fixed.stdout, fixed.stdout[-3000:]
