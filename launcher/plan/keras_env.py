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


class KerasJob:
    """The job's processes, worked out once per plan: every task's variables share one string of
    addresses, so that planning N tasks stays O(N) in time and memory."""

    def __init__(self, cluster: Mapping[str, Sequence[str]]):
        members = [(role, index, address)
                   for role in _JOB_ROLES
                   for index, address in enumerate(cluster.get(role, ()))]
        self.addresses = ",".join(address for _, _, address in members)
        self.size = str(len(members))
        self.process_ids = {(role, index): process_id for process_id, (role, index, _) in enumerate(members)}

    def env(self, task_type: str, task_index: int) -> dict[str, str]:
        """KERAS_DISTRIBUTION_* for one task; empty for a task outside the job (the evaluator)."""
        process_id = self.process_ids.get((task_type, task_index))
        if process_id is None:
            return {}
        return {ENV_KERAS_JOB_ADDRESSES: self.addresses, ENV_KERAS_NUM_PROCESSES: self.size,
                ENV_KERAS_PROCESS_ID: str(process_id)}


def collectives_env(visible_devices: str | None) -> dict[str, str]:
    """JAX's CPU collectives for a task that has no GPUs (CUDA_VISIBLE_DEVICES empty).

    Tasks with GPUs, and tasks on hosts whose GPUs were not counted (None), keep JAX's default.
    """
    if visible_devices == "":
        return {ENV_JAX_CPU_COLLECTIVES: CPU_COLLECTIVES}
    return {}
