"""examples/torch_ddp.py keeps its global batch on fewer processes than planned: one process told
that the job was planned for two (MGPU_WORLD_SIZE_MAX=2, as a run that went on without a host is)
adds up two batches per optimizer step, and ends with the weights of one process that takes the
two processes' global batch at once."""

import os
import re
import subprocess
import sys

import pytest
from needs import installed_version

from launching import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def weights_sum(tmp_path, batch_size: int, planned: int) -> float:
    """The example run as process 0 of a job of one (the variables mgpu sets), planned for `planned`."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "MGPU_WORLD_SIZE_MAX": str(planned),
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "torch_ddp.py"), "--epochs", "2",
                           "--batch-size", str(batch_size), "--dataset-size", "512",
                           "--snapshot", str(tmp_path / f"snapshot-{batch_size}-{planned}.pt")],
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    return float(re.search(r"weights sum (\S+)", done.stdout).group(1))


def test_one_process_of_two_planned_keeps_the_global_batch(tmp_path):
    installed_version("torch")
    kept = weights_sum(tmp_path, batch_size=32, planned=2)  # two batches of 32 per step
    whole = weights_sum(tmp_path, batch_size=64, planned=1)  # one batch of 64 per step
    assert kept == pytest.approx(whole, abs=1e-6), (kept, whole)  # -1.07 with the planned size ignored
