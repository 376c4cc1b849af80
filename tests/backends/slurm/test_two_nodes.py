"""Two Slurm nodes as network namespaces of our own (one slurmd each, slurmctld in the root
namespace): an sbatch job runs `mgpu launch --slurm` and the built-in trainer across them."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import socket
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ssh"))  # the network-namespace lab

from slurm_helpers import REQUIRE, Node, start_slurm  # noqa: E402
from ssh_helpers import Netns, require_tools  # noqa: E402

pytestmark = [pytest.mark.netns, pytest.mark.slow]
MGPU = [sys.executable, "-m", "launcher"]


@pytest.fixture
def two_nodes(tmp_path_factory):
    require_tools("ip")
    if os.geteuid() != 0:
        if REQUIRE:
            pytest.fail("network namespaces need root and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip("network namespaces need root")
    lab = Netns.create(("h1", "h2"))
    slurm = None
    try:
        nodes = tuple(Node(name, address, lab.namespaces[name]) for name, address in lab.hosts.items())
        slurm = start_slurm(tmp_path_factory.mktemp("slurm2"), nodes,
                            controller=f"{socket.gethostname()}({lab.subnet}.1)")
        yield slurm
    finally:
        if slurm is not None:
            slurm.stop()
        lab.destroy()


def test_trainer_across_two_nodes(two_nodes, tmp_path):
    model_dir, runs = tmp_path / "model", tmp_path / "runs"
    argv = [*MGPU, "launch", "--slurm", "--port", "23600", "--run-id", "two-nodes", "--log-dir", str(runs),
            # Worker 1 prints only TensorFlow's start-up notices: shown, they prove its output is relayed.
            "--threads-per-task", "1", "--show-tf-logs", "--", "--dataset", "synthetic", "--model", "small", "--train-steps", "4",
            "--batch-size-per-replica", "16", "--log-every", "2", "--model-dir", str(model_dir)]
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    done = two_nodes.run("sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", "--time=10",
                         f"--output={tmp_path}/job.out", str(script), cwd=tmp_path, timeout=300)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, done.stderr + output[-4000:] + two_nodes.log_tail()
    record = json.loads((runs / "two-nodes" / "run.json").read_text())
    assert [plan["host"] for plan in record["plans"]] == ["h1", "h2"]
    assert record["plans"][0]["tf_config"]["cluster"] == {"worker": ["h1:23600", "h2:23600"]}
    assert record["status"] == "succeeded"
    assert "[worker:1]" in output and "all 2 tasks ready" in output
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["num_replicas"] == 2 and metrics["global_step"] == 4
