"""The Keras 3 distribution environment of each task. Pure: no I/O.

On the JAX backend, `keras.distribution.initialize()` reads the job's addresses (the first is the
coordinator, process 0), the number of processes and this process's id, and hands the coordinator
to `jax.distributed.initialize()`. They come from the same cluster addresses as TF_CONFIG, so a
program may use either route. The evaluator is not a member of the job and gets none of them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from launcher.config.spec import CHIEF, WORKER
from launcher.protocol import (
    ENV_JAX_CPU_COLLECTIVES, ENV_KERAS_JOB_ADDRESSES, ENV_KERAS_NUM_PROCESSES, ENV_KERAS_PROCESS_ID,
)

# The order of processes: the chief, when there is one, is process 0 and so the coordinator.
_JOB_ROLES = (CHIEF, WORKER)
# JAX's cross-process collectives for CPU-only tasks. Recent JAX already defaults to it; older
# releases default to none, and then every cross-process computation fails.
CPU_COLLECTIVES = "gloo"


def job_members(cluster: Mapping[str, Sequence[str]]) -> list[tuple[str, int, str]]:
    """(type, index, address) of each process of the job, in process-id order."""
    return [(role, index, address)
            for role in _JOB_ROLES
            for index, address in enumerate(cluster.get(role, ()))]


def keras_distribution_env(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> dict[str, str]:
    """KERAS_DISTRIBUTION_* for one task; empty for a task outside the job (the evaluator)."""
    members = job_members(cluster)
    ids = {(role, index): process_id for process_id, (role, index, _) in enumerate(members)}
    if (task_type, task_index) not in ids:
        return {}
    return {
        ENV_KERAS_JOB_ADDRESSES: ",".join(address for _, _, address in members),
        ENV_KERAS_NUM_PROCESSES: str(len(members)),
        ENV_KERAS_PROCESS_ID: str(ids[task_type, task_index]),
    }


def collectives_env(visible_devices: str | None) -> dict[str, str]:
    """JAX's CPU collectives for a task that has no GPUs (CUDA_VISIBLE_DEVICES empty).

    Tasks with GPUs, and tasks on hosts whose GPUs were not counted (None), keep JAX's default.
    """
    if visible_devices == "":
        return {ENV_JAX_CPU_COLLECTIVES: CPU_COLLECTIVES}
    return {}
