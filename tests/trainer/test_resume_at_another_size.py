"""The trainer's checkpoint resumed by fewer workers than wrote it, under the real `mgpu launch`, with
MGPU_WORLD_SIZE_MAX the planned size as the launcher gives it to a run that lost a host, and the run
finished there: the replicas on two end with the same weights. The same run on three SSH hosts that
loses one and takes it back (tests/backends/ssh/test_shrink.py) proves the resume on more workers, and
the stream's position after a change of batch."""

import json
import re
import sys

import pytest
from needs import installed_version

from launching import finish, start_mgpu
from trainer_helpers import FAST

pytestmark = pytest.mark.slow
installed_version("tensorflow", "the train extra")

PLANNED = 3
GLOBAL_BATCH = 45  # divides among 3 replicas, not among 2


def train(tmp_path, workers: int, steps: int) -> str:
    """`mgpu launch --local WORKERS` of the trainer up to step STEPS in one model dir; its output."""
    trainer = ["env", f"MGPU_WORLD_SIZE_MAX={PLANNED}", sys.executable, "-m", "launcher.trainer"]
    code, out = finish(start_mgpu(
        "launch", "--local", str(workers), "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"),
        "--run-id", f"on-{workers}-to-{steps}", "--", *trainer, *FAST, "--global-batch-size", str(GLOBAL_BATCH),
        "--train-steps", str(steps), "--log-every", "5", "--steps-per-loop", "5", "--eval-steps", "1",
        "--model-dir", str(tmp_path / "model"), cwd=tmp_path), 240)
    assert code == 0, out[-3000:]
    return out


def metrics(tmp_path) -> dict:
    return json.loads((tmp_path / "model" / "metrics.json").read_text())


def chief_lines(out: str) -> list[str]:
    return [line.removeprefix("[worker:0] ") for line in out.splitlines() if line.startswith("[worker:0] ")]


def test_a_checkpoint_of_three_workers_resumes_on_two_with_the_nearest_batch_that_divides(tmp_path):
    first = chief_lines(train(tmp_path, PLANNED, 5))
    assert not [line for line in first if "planned workers" in line or line.startswith("resumed from")], first
    assert f"{PLANNED} worker(s), {PLANNED} replica(s), global batch {GLOBAL_BATCH}," in "\n".join(first)

    # Two of the three: the planned batch does not divide among them, and one line says what is used instead.
    second = chief_lines(train(tmp_path, 2, 10))
    assert ("on 2 of the 3 planned workers: the planned global batch 45 does not divide among 2 replicas; "
            "global batch 44, 22 per replica") in second, second
    resumed = [line for line in second if line.startswith("resumed from")]
    assert resumed == [f"resumed from {tmp_path / 'model' / 'ckpt-5'} at step 5, example {5 * 45} of the "
                       "training stream, written by 3 workers, now 2"], second
    shrunk = metrics(tmp_path)
    assert shrunk["global_step"] == 10 and shrunk["num_replicas"] == 2
    assert len(shrunk["replica_fingerprints"]) == 2 and len(set(shrunk["replica_fingerprints"])) == 1, shrunk
    # The start on two trained from where the one before it ended: its first log line is 5 steps past the checkpoint.
    assert [int(re.search(r"train step=(\d+)/", line)[1]) for line in second if line.startswith("train step=")] \
        == [10]
