"""This task's place in the cluster, from TF_CONFIG or --worker-hosts/--task-index.

Pure JSON work, no TensorFlow: the strategy choice it enables is validated before
the slow import.
"""

from __future__ import annotations

import dataclasses
import json
import os

from launcher.errors import UsageError
from launcher.protocol import TRAINER_TASK_TYPES, TRAINING_TASK_TYPES
from launcher.trainer.planned_size import planned_workers



@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    tf_config: dict | None  # None: a single process with no cluster
    task_type: str  # chief | worker | evaluator
    task_index: int
    num_workers: int  # training tasks (chief + workers)
    worker_index: int  # position among the training tasks; the chief is 0
    planned_workers: int | None = None  # training tasks the run was planned with (MGPU_WORLD_SIZE_MAX)

    @property
    def is_chief(self) -> bool:
        return self.task_type != "evaluator" and self.worker_index == 0

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == "evaluator"

    @property
    def name(self) -> str:
        return f"{self.task_type}:{self.task_index}"

    def peer_addresses(self) -> list[str]:
        """host:port of every other training task."""
        if self.tf_config is None or self.is_evaluator:
            return []
        mine = self.tf_config["cluster"][self.task_type][self.task_index]
        return [address for role in TRAINING_TASK_TYPES for address in self.tf_config["cluster"].get(role, [])
                if address != mine]


def resolve(worker_hosts: tuple[str, ...] | None, task_index: int | None,
            environ=os.environ) -> ClusterInfo:
    """Read TF_CONFIG, or build it from --worker-hosts (then also export it for TensorFlow), and
    the planned number of workers."""
    return dataclasses.replace(_resolve_cluster(worker_hosts, task_index, environ),
                               planned_workers=planned_workers(environ))


def _resolve_cluster(worker_hosts: tuple[str, ...] | None, task_index: int | None, environ) -> ClusterInfo:
    raw = environ.get("TF_CONFIG", "").strip()
    if raw and worker_hosts is not None:
        raise UsageError("TF_CONFIG is set: do not also pass --worker-hosts/--task-index")
    if worker_hosts is not None:
        tf_config = {"cluster": {"worker": list(worker_hosts)},
                     "task": {"type": "worker", "index": task_index}}
        environ["TF_CONFIG"] = json.dumps(tf_config)
    elif raw:
        try:
            tf_config = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UsageError(f"TF_CONFIG is not valid JSON: {exc}") from None
    else:
        return ClusterInfo(None, "worker", 0, 1, 0)
    return from_tf_config(tf_config)


def from_tf_config(tf_config) -> ClusterInfo:
    if not isinstance(tf_config, dict):
        raise UsageError("TF_CONFIG must be a JSON object")
    cluster = tf_config.get("cluster")
    task = tf_config.get("task")
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise UsageError('TF_CONFIG needs "cluster" and "task" objects')
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in TRAINER_TASK_TYPES:
        raise UsageError(f"TF_CONFIG task type must be chief, worker or evaluator, not {task_type!r}")
    if not isinstance(task_index, int) or task_index < 0:
        raise UsageError(f"TF_CONFIG task index must be a non-negative integer, not {task_index!r}")
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise UsageError(f'TF_CONFIG cluster job "{job}" must be a list of "host:port"')
    chiefs = len(cluster.get("chief", []))
    workers = len(cluster.get("worker", []))
    if chiefs > 1:
        raise UsageError("TF_CONFIG may name at most one chief")
    if chiefs + workers == 0:
        raise UsageError("TF_CONFIG cluster has no chief or worker")
    if task_type != "evaluator" and task_index >= len(cluster.get(task_type, [])):
        raise UsageError(f"TF_CONFIG task {task_type}:{task_index} is not in the cluster")
    if task_type == "chief":
        worker_index = 0
    elif task_type == "worker":
        worker_index = task_index + chiefs
    else:
        worker_index = -1
    return ClusterInfo(tf_config, task_type, task_index, chiefs + workers, worker_index)


def choose_strategy(requested: str, num_workers: int, num_gpus: int) -> str:
    """The strategy to build: default | one_device | mirrored | multi_worker_mirrored."""
    if requested == "auto":
        if num_workers > 1:
            return "multi_worker_mirrored"
        return "mirrored" if num_gpus > 1 else "default"
    if num_workers > 1 and requested != "multi_worker_mirrored":
        raise UsageError(
            f"--distribution-strategy {requested} cannot train the {num_workers} workers in "
            "TF_CONFIG; use multi_worker_mirrored or auto"
        )
    return "default" if requested == "off" else requested
