"""TensorFlow's C++ chatter stays off the console unless asked for; the log keeps every line."""

import dataclasses
import sys

import pytest

from supervisor_helpers import make_plans, supervise_plans

pytestmark = pytest.mark.timeout(60)

# What a GPU-less TensorFlow 2.21 prints at import and later, whatever TF_CPP_MIN_LOG_LEVEL says.
NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795443905.084638   10716 port.cc:153] oneDNN custom operations are on.",
    "E0000 00:00:1795443908.504045   10716 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error",
    "W0000 00:00:1795443533.403446    3662 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized",
    "W1123 12:00:05.123456    3662 collective_ops.cc:12] Example stragglers:",
    "/job:worker/replica:0/task:1",
]
SAID = ["step 1 of the program", "", "E0000 00:00:1795443908.6 1 grpc.cc:9] an error record that is not noise"]


def run_task(run_id, tmp_path, **options):
    script = "import sys\n" + "".join(f"print({line!r}, file=sys.stderr, flush=True)\n" for line in NOISE)
    script += "".join(f"print({line!r}, flush=True)\n" for line in SAID)
    plans = [dataclasses.replace(plan, argv=(sys.executable, "-c", script))
             for plan in make_plans(run_id, [], workers=1)]
    result = supervise_plans(plans, run_id, tmp_path, **options)
    assert result.error is None, result.console
    log = (result.run_dir / "worker-0.log").read_text().splitlines()
    assert sorted(log) == sorted(NOISE + SAID)
    return [line for line in result.console.splitlines() if line.startswith("[worker:0] ")]


def test_the_console_leaves_out_tensorflow_chatter(run_id, tmp_path):
    assert run_task(run_id, tmp_path) == [f"[worker:0] {line}" for line in SAID]


def test_show_tf_logs_shows_every_line(run_id, tmp_path):
    shown = run_task(run_id, tmp_path, show_tf_logs=True)
    assert sorted(shown) == sorted(f"[worker:0] {line}" for line in NOISE + SAID)
