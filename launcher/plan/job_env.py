"""The distribution environment of each task beside TF_CONFIG: Keras 3, PyTorch, JAX. Pure: no I/O.

Every framework numbers the same processes from the same cluster addresses as TF_CONFIG: the
chief, when there is one, is process 0, then the workers in order; process 0's address is the
coordinator (Keras on JAX) and the rendezvous (PyTorch's MASTER_ADDR:MASTER_PORT), so a program may
take any route (JAX's coordinator listens where TF's server of the same task would). The evaluator is not a member of the job and gets none of them.

- Keras 3 on JAX: `keras.distribution.initialize()` reads KERAS_DISTRIBUTION_*.
- PyTorch: `init_process_group()` (env://) reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
  LOCAL_RANK and LOCAL_WORLD_SIZE count the members on the task's host, as torchrun sets them. The
  rest of torchrun's contract too (protocol.py): torch takes a process for one torchrun started
  when TORCHELASTIC_RUN_ID is set, and Lightning then reads GROUP_RANK as its node rank; without
  them Lightning takes NODE_RANK (0 by default) and every host believes it is node 0. A host is
  torchrun's node: GROUP_RANK numbers the hosts in the order of their first member.
- JAX: `jax.distributed.initialize()` reads JAX_COORDINATOR_ADDRESS; JAX_NUM_PROCESSES and
  JAX_PROCESS_ID (Kubeflow Trainer's names) are for the program to pass in.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from launcher.plan.coordinator import JOB_ROLES, Coordinator
from launcher.protocol import (
    ENV_TORCH_GROUP_RANK, ENV_TORCH_GROUP_WORLD_SIZE, ENV_TORCH_NODE_RANK, ENV_TORCH_ROLE_NAME, ENV_TORCH_ROLE_RANK,
    ENV_TORCH_ROLE_WORLD_SIZE, ENV_TORCHELASTIC_MAX_RESTARTS, ENV_TORCHELASTIC_RESTART_COUNT, ENV_TORCHELASTIC_RUN_ID,
    TORCH_ROLE, ENV_JAX_COORDINATOR_ADDRESS, ENV_JAX_CPU_COLLECTIVES, ENV_JAX_NUM_PROCESSES, ENV_JAX_PROCESS_ID, ENV_KERAS_JOB_ADDRESSES, ENV_KERAS_NUM_PROCESSES, ENV_KERAS_PROCESS_ID,
    ENV_TORCH_LOCAL_RANK, ENV_TORCH_LOCAL_WORLD_SIZE, ENV_TORCH_MASTER_ADDR, ENV_TORCH_MASTER_PORT, ENV_TORCH_RANK,
    ENV_TORCH_WORLD_SIZE,
)

# JAX's cross-process collectives for CPU-only tasks. Recent JAX already defaults to it; older
# releases default to none, and then every cross-process computation fails.
CPU_COLLECTIVES = "gloo"


class Job:
    """The job's processes, worked out once per plan: the strings every task shares (the addresses,
    the sizes) are made once, so that planning N tasks stays O(N) in time and memory.

    `cluster` is TF_CONFIG's cluster; `coordinator` its first member, as the planner found it;
    `machine_of` names the machine of each member, by (role, index), for the per-host counts;
    `run_id` and `max_restarts` are torchrun's run id and restart budget.
    """

    def __init__(self, cluster: Mapping[str, Sequence[str]], coordinator: Coordinator | None,
                 machine_of: Mapping[tuple[str, int], str], run_id: str = "", max_restarts: int = 0):
        members = [(role, index, address)
                   for role in JOB_ROLES
                   for index, address in enumerate(cluster.get(role, ()))]
        self.addresses = ",".join(address for _, _, address in members)
        self.coordinator = str(coordinator) if coordinator else ""
        self.size = str(len(members))
        self.process_ids = {(role, index): process_id for process_id, (role, index, _) in enumerate(members)}
        self.master_addr, self.master_port = (coordinator.address, str(coordinator.port)) if coordinator else ("", "")
        self.local_ranks: dict[tuple[str, int], str] = {}
        counts: dict[str, int] = {}
        for role, index, _ in members:
            machine = machine_of.get((role, index), "")
            self.local_ranks[(role, index)] = str(counts.get(machine, 0))
            counts[machine] = counts.get(machine, 0) + 1
        sizes = {machine: str(count) for machine, count in counts.items()}
        self.local_sizes = {name: sizes[machine_of.get(name, "")] for name in self.local_ranks}
        groups = {machine: str(group) for group, machine in enumerate(counts)}  # dicts keep the first member's order
        self.group_ranks = {name: groups[machine_of.get(name, "")] for name in self.local_ranks}
        self.group_size = str(len(groups))
        self.run_id = run_id
        self.max_restarts = str(max_restarts)

    def env(self, task_type: str, task_index: int) -> dict[str, str]:
        """The job's variables for one task; empty for a task outside the job (the evaluator)."""
        name = (task_type, task_index)
        process_id = self.process_ids.get(name)
        if process_id is None:
            return {}
        rank = str(process_id)
        return {
            ENV_KERAS_JOB_ADDRESSES: self.addresses, ENV_KERAS_NUM_PROCESSES: self.size, ENV_KERAS_PROCESS_ID: rank,
            ENV_TORCH_RANK: rank, ENV_TORCH_WORLD_SIZE: self.size,
            ENV_TORCH_LOCAL_RANK: self.local_ranks[name], ENV_TORCH_LOCAL_WORLD_SIZE: self.local_sizes[name],
            ENV_TORCH_MASTER_ADDR: self.master_addr, ENV_TORCH_MASTER_PORT: self.master_port,
            ENV_TORCH_GROUP_RANK: self.group_ranks[name], ENV_TORCH_GROUP_WORLD_SIZE: self.group_size,
            ENV_TORCH_NODE_RANK: self.group_ranks[name], ENV_TORCH_ROLE_NAME: TORCH_ROLE,
            ENV_TORCH_ROLE_RANK: rank, ENV_TORCH_ROLE_WORLD_SIZE: self.size,
            ENV_TORCHELASTIC_RUN_ID: self.run_id, ENV_TORCHELASTIC_RESTART_COUNT: "0",
            ENV_TORCHELASTIC_MAX_RESTARTS: self.max_restarts,
            ENV_JAX_COORDINATOR_ADDRESS: self.coordinator, ENV_JAX_NUM_PROCESSES: self.size, ENV_JAX_PROCESS_ID: rank,
        }


def collectives_env(visible_devices: str | None) -> dict[str, str]:
    """JAX's CPU collectives for a task that has no GPUs (CUDA_VISIBLE_DEVICES empty).

    Tasks with GPUs, and tasks on hosts whose GPUs were not counted (None), keep JAX's default.
    """
    if visible_devices == "":
        return {ENV_JAX_CPU_COLLECTIVES: CPU_COLLECTIVES}
    return {}
