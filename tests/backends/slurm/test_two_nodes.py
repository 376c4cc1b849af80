"""Slurm nodes as network namespaces of our own (one slurmd each, slurmctld in the root
namespace), three of them, one cluster for the module's jobs: an sbatch job runs `mgpu launch
--slurm` and the built-in trainer across two of them; on all three, a node left out gives its task
to the spare node of the allocation, or the run goes on on the nodes left."""

from __future__ import annotations

import json
import sys

import pytest

from slurm_netns import sbatch_wait, slurm_lab

pytestmark = [pytest.mark.netns, pytest.mark.slow]
MGPU = [sys.executable, "-m", "launcher"]


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    """One Slurm cluster for every test here: each test's job has its own run id and folders, and
    `sbatch --wait` returns once the job has ended, its nodes idle again for the next."""
    yield from slurm_lab(tmp_path_factory, ("h1", "h2", "h3"))


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
