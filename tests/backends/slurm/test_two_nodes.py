"""Slurm nodes as network namespaces of our own (one slurmd each, slurmctld in the root
namespace), three of them, one cluster for the module's jobs: an sbatch job runs `mgpu launch
--slurm` and the built-in trainer across two of them; on all three, a node left out gives its task
to the spare node of the allocation, or the run goes on on the nodes left."""

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


def _slurm_lab(tmp_path_factory, names: tuple[str, ...]):
    require_tools("ip")
    if os.geteuid() != 0:
        if REQUIRE:
            pytest.fail("network namespaces need root and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip("network namespaces need root")
    lab = Netns.create(names)
    slurm = None
    try:
        nodes = tuple(Node(name, address, lab.namespaces[name]) for name, address in lab.hosts.items())
        slurm = start_slurm(tmp_path_factory.mktemp(f"slurm{len(names)}"), nodes,
                            controller=f"{socket.gethostname()}({lab.subnet}.1)")
        yield slurm
    finally:
        if slurm is not None:
            slurm.stop()
        lab.destroy()


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    """One Slurm cluster for every test here: each test's job has its own run id and folders, and
    `sbatch --wait` returns once the job has ended, its nodes idle again for the next."""
    yield from _slurm_lab(tmp_path_factory, ("h1", "h2", "h3"))


def sbatch_wait(lab, tmp_path, argv, nodes: int) -> str:
    """Run `argv` as the batch script of a job on `nodes` nodes, wait for it, and return its output;
    the job must succeed."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    done = lab.run("sbatch", "--wait", f"--nodes={nodes}", "--ntasks-per-node=1", "--time=10",
                   f"--output={tmp_path}/job.out", str(script), cwd=tmp_path, timeout=300)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, done.stderr + output[-4000:] + lab.log_tail()
    return output


def test_trainer_across_two_nodes(three_nodes, tmp_path):
    """The built-in trainer in a Slurm step, one task on each of two nodes (the one test of the
    trainer under --slurm: TensorFlow's start is some CPU-seconds a task)."""
    model_dir, runs = tmp_path / "model", tmp_path / "runs"
    argv = [*MGPU, "launch", "--slurm", "--port", "23600", "--run-id", "two-nodes", "--log-dir", str(runs),
            # Worker 1 prints only TensorFlow's start-up notices: shown, they prove its output is relayed.
            "--threads-per-task", "1", "--show-tf-logs", "--", "--dataset", "synthetic", "--model", "small", "--train-steps", "4",
            "--batch-size-per-replica", "16", "--log-every", "2", "--model-dir", str(model_dir)]
    output = sbatch_wait(three_nodes, tmp_path, argv, nodes=2)
    record = json.loads((runs / "two-nodes" / "run.json").read_text())
    assert [plan["host"] for plan in record["plans"]] == ["h1", "h2"]
    assert record["plans"][0]["tf_config"]["cluster"] == {"worker": ["h1:23600", "h2:23600"]}
    assert record["status"] == "succeeded"
    assert "[worker:1]" in output and "all 2 tasks ready" in output
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["num_replicas"] == 2 and metrics["global_step"] == 4
    tasks = record["attempts"][0]["tasks"]
    assert [tasks[f"worker:{i}"]["exit_code"] for i in range(2)] == [0, 0]
    assert all(tasks[f"worker:{i}"]["ready_at"] for i in range(2))


def test_a_node_killed_twice_gives_its_task_to_the_spare_node(three_nodes, tmp_path):
    """h3 is held back; the task on h1 (the batch script's node) is killed by SIGKILL in each step,
    so h1 is left out after the second and the third step runs on h2 and h3: srun picks the
    first nodes of the allocation unless told to exclude the others, and a task on another
    node than planned would refuse to start."""
    runs = tmp_path / "runs"
    program = 'if [ "$SLURMD_NODENAME" = h1 ]; then kill -9 $$; fi; echo "on $SLURMD_NODENAME"'
    argv = [*MGPU, "launch", "--slurm", "--spare-hosts", "h3", "--max-restarts", "3", "--run-id", "spare-node",
            "--log-dir", str(runs), "--", "sh", "-c", program]
    output = sbatch_wait(three_nodes, tmp_path, argv, nodes=3)
    record = json.loads((runs / "spare-node" / "run.json").read_text())
    assert record["status"] == "succeeded", output[-4000:]
    assert [attempt.get("cause") for attempt in record["attempts"]] == ["killed", "killed", None]
    assert [(left["host"], left["replaced_by"]) for left in record["costs"]["left_out"]] == [("h1", "h3 took worker:0")]
    # The spare's task keeps its index; ranked by the allocation's order, it is the step's last task.
    assert "[worker:0] on h3" in output and "[worker:1] on h2" in output, output[-4000:]


def test_a_node_killed_twice_with_no_spare_leaves_the_run_on_the_nodes_left(three_nodes, tmp_path):
    """--min-hosts 2 and no spare: h1's task is killed in each step, so h1 is left out after the
    second, and the third step runs on h2 and h3 alone (srun --nodes=2 --exclude=h1), the plans
    made again for two: WORLD_SIZE 2, the planned size 3."""
    runs = tmp_path / "runs"
    program = ('if [ "$SLURMD_NODENAME" = h1 ]; then kill -9 $$; fi; '
               'echo "on $SLURMD_NODENAME rank $RANK of $WORLD_SIZE, planned $MGPU_WORLD_SIZE_MAX"')
    argv = [*MGPU, "launch", "--slurm", "--min-hosts", "2", "--max-restarts", "3", "--run-id", "fewer-nodes",
            "--log-dir", str(runs), "--", "sh", "-c", program]
    output = sbatch_wait(three_nodes, tmp_path, argv, nodes=3)
    record = json.loads((runs / "fewer-nodes" / "run.json").read_text())
    assert record["status"] == "succeeded", output[-4000:]
    assert [attempt.get("cause") for attempt in record["attempts"]] == ["killed", "killed", None]
    assert {name: task["host"] for name, task in record["attempts"][2]["tasks"].items()} == {
        "worker:0": "h2", "worker:1": "h3"}
    assert [(change["dropped"], change["hosts"]) for change in record["size_changes"]] == [
        (["h1"], {"from": 3, "to": 2, "planned": 3})]
    assert "[worker:0] on h2 rank 0 of 2, planned 3" in output and "[worker:1] on h3 rank 1 of 2, planned 3" in output, \
        output[-4000:]
    assert "no spare host for h1: the run goes on on 2 of 3 hosts (--min-hosts 2)" in output, output[-4000:]
