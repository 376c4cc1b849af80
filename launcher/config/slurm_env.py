"""What a Slurm allocation or job step says about itself, read from its SLURM_* variables.

Pure: the environment is passed in. Task ranks follow Slurm's block layout: the first node's
tasks come first, in the order of the node list as Slurm wrote it (never sorted by name:
node9 comes before node10 because Slurm ranks it first).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from launcher.config.addresses import is_number, parse_host
from launcher.config.hostlist import expand_hostlist, expand_tasks_per_node
from launcher.errors import UsageError

NO_ALLOCATION = (
    "--slurm needs a Slurm allocation (SLURM_JOB_ID is not set): run mgpu inside one, e.g. "
    "`salloc -N 2 --ntasks-per-node 2 mgpu launch --slurm`, or in an sbatch script"
)


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The nodes of a job (or of one step) and how many tasks each runs."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    gpus_per_task: int | None = None  # from sbatch/salloc --gpus-per-task, when given

    @property
    def task_count(self) -> int:
        return sum(self.tasks_per_node)

    def node_of_rank(self, rank: int) -> str:
        """The node that runs task `rank` in block distribution."""
        for node, count in zip(self.nodes, self.tasks_per_node):
            if rank < count:
                return node
            rank -= count
        raise UsageError(f"task rank out of range: the allocation has {self.task_count} tasks")

    def local_index(self, rank: int) -> int:
        """The rank's position among its node's tasks (0 for the node's first task)."""
        for count in self.tasks_per_node:
            if rank < count:
                return rank
            rank -= count
        raise UsageError(f"task rank out of range: the allocation has {self.task_count} tasks")


def read_allocation(env: Mapping[str, str], step: bool = False) -> Allocation:
    """The allocation the environment describes; `step` prefers the current step's node list and
    task layout (SLURM_STEP_*) to the job's. Raises UsageError outside an allocation."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise UsageError(NO_ALLOCATION)
    step_first = ("SLURM_STEP_",) if step else ()
    nodelist = _first(env, [p + "NODELIST" for p in (*step_first, "SLURM_JOB_", "SLURM_")])
    if not nodelist:
        raise UsageError(f"Slurm job {job_id}: SLURM_JOB_NODELIST is not set")
    layout = _first(env, [p + "TASKS_PER_NODE" for p in (*step_first, "SLURM_")])
    try:
        nodes = tuple(parse_host(node) for node in expand_hostlist(nodelist))  # they go into TF_CONFIG
        counts = tuple(expand_tasks_per_node(layout)) if layout else (1,) * len(nodes)
    except ValueError as exc:
        raise UsageError(f"Slurm job {job_id}: {exc}") from None
    if len(counts) != len(nodes):
        raise UsageError(f"Slurm job {job_id}: {len(nodes)} nodes ({nodelist}) but tasks per node for "
                         f"{len(counts)} ({layout})")
    return Allocation(job_id, nodes, counts, _gpus_per_task(env.get("SLURM_GPUS_PER_TASK")))


def without_nodes(allocation: Allocation, nodes: tuple[str, ...]) -> Allocation:
    """The allocation less `nodes`, which its tasks leave free (spares, under `--spare-hosts`);
    UsageError for a node the allocation does not have, or when no node would be left."""
    missing = [node for node in nodes if node not in allocation.nodes]
    if missing:
        raise UsageError(f"spare host {missing[0]} is not a node of Slurm job {allocation.job_id} "
                         f"({', '.join(allocation.nodes)})")
    kept = [(node, count) for node, count in zip(allocation.nodes, allocation.tasks_per_node) if node not in nodes]
    if not kept:
        raise UsageError(f"Slurm job {allocation.job_id}: every node is a spare; none is left to run the tasks")
    return dataclasses.replace(allocation, nodes=tuple(n for n, _ in kept), tasks_per_node=tuple(c for _, c in kept))


def _first(env: Mapping[str, str], names: list[str]) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)


def _gpus_per_task(text: str | None) -> int | None:
    """`2`, or `a100:2` (a GPU type and a count)."""
    if not text:
        return None
    count = text.rpartition(":")[2]
    return int(count) if is_number(count) else None


def step_rank(env: Mapping[str, str]) -> int:
    """This task's rank in its step (SLURM_PROCID). Raises UsageError outside a step."""
    rank = env.get("SLURM_PROCID", "")
    if not rank:
        raise UsageError("SLURM_PROCID is not set: run this inside a job step (srun), once per task")
    if not is_number(rank):
        raise UsageError(f"SLURM_PROCID {rank!r} is not a task rank (ASCII digits)")
    return int(rank)


def misplacement(env: Mapping[str, str], rank: int, host: str) -> str | None:
    """Why task `rank` must not start here: Slurm placed it on another node (SLURMD_NODENAME) than
    `host`, where block distribution puts it and where its TF_CONFIG address is. None when it is
    on `host`, or when the node is not known."""
    node = env.get("SLURMD_NODENAME")
    if node is None or node == host:
        return None
    return (f"task {rank} runs on {node}, but block distribution puts it on {host}: "
            f"start the step with srun --distribution=block")
