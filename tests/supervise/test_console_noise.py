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


# The record every worker and parameter server of TensorFlow's parameter-server tutorial writes at
# its start (TF 2.21): an INFO line, then its ConfigProto as text after protobuf's debug-string marker,
# then a blank line; 21 of a worker's 23 console lines were this record's.
SESSION_OPTIONS = [
    "I0000 00:00:1795877465.136475   16224 eager_service_impl.cc:355] SessionOptions: goo.gle/debugstr  ",
    "device_count {", '  key: "CPU"', "  value: 1", "}", "gpu_options {", "  experimental {", "  }", "}",
    "allow_soft_placement: true", "experimental {", '  collective_group_leader: "/job:ps/replica:0/task:0"', "}",
    "",
]


def test_the_lines_of_a_multi_line_record_stay_off_the_console_too(run_id, tmp_path):
    # The program's own lines on the same stream, shaped like the record's, before and after it.
    own = ["worker:0 serving", "step: 1", ""]
    script = "import sys\n" + "".join(f"print({line!r}, file=sys.stderr, flush=True)\n"
                                      for line in own + SESSION_OPTIONS + own)
    plans = [dataclasses.replace(plan, argv=(sys.executable, "-c", script))
             for plan in make_plans(run_id, [], workers=1)]
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None, result.console
    assert (result.run_dir / "worker-0.log").read_text().splitlines() == own + SESSION_OPTIONS + own
    shown = [line for line in result.console.splitlines() if line.startswith("[worker:0]")]
    assert shown == [f"[worker:0] {line}" for line in own + own], result.console
