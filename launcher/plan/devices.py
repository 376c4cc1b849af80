"""The split of GPUs between tasks, as CUDA_VISIBLE_DEVICES. Pure: GPU counts are passed in."""

from __future__ import annotations

import collections
from typing import Sequence

from launcher.errors import UsageError

NO_GPUS = ""  # hides every GPU (the launcher quotes it, so it survives SSH)


def split_devices(machine_of: Sequence[str], local_gpu_count: int, gpus_per_task: int | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES per task; `machine_of` names each task's machine, "" for this one.

    Only this machine's GPU count is known at planning time; remote hosts keep their own default.
    """
    tasks_on = collections.Counter(machine_of)
    per_machine = {
        machine: iter(assign_visible_devices(local_gpu_count if machine == "" else None, count, gpus_per_task))
        for machine, count in tasks_on.items()
    }
    return [next(per_machine[machine]) for machine in machine_of]


def assign_visible_devices(gpu_count: int | None, tasks_on_host: int, gpus_per_task: int | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each task on one host, in the order of the tasks there.

    gpu_count: GPUs on the host, or None when unknown (a remote host at planning time).
    gpus_per_task: None splits the host's GPUs evenly, and tasks share GPUs round-robin when there
        are fewer GPUs than tasks; 0 hides every GPU; k > 0 gives task i GPUs i*k .. i*k+k-1.
    A value of None means: leave CUDA_VISIBLE_DEVICES alone (auto split on a host of unknown size).

    Pure, so that planning stays free of I/O; raises UsageError when a known host has too few GPUs.
    """
    if gpus_per_task == 0 or (gpus_per_task is None and gpu_count == 0):
        return [NO_GPUS] * tasks_on_host
    if gpus_per_task is None:
        if gpu_count is None:
            return [None] * tasks_on_host
        share = max(gpu_count // tasks_on_host, 1)
        return [",".join(str((i * share + g) % gpu_count) for g in range(share)) for i in range(tasks_on_host)]
    if gpu_count is not None and gpus_per_task * tasks_on_host > gpu_count:
        raise UsageError(
            f"{tasks_on_host} tasks x {gpus_per_task} GPUs each need {gpus_per_task * tasks_on_host} GPUs; "
            f"the host has {gpu_count}"
        )
    return [",".join(str(i * gpus_per_task + g) for g in range(gpus_per_task)) for i in range(tasks_on_host)]


# For tasks that share a GPU: TensorFlow and JAX each take most of a GPU's memory when they start
# unless told to grow as needed, and then a second process on that GPU runs out of memory.
SHARED_GPU_ENV = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def shares_a_gpu(machine_of: Sequence[str], devices: Sequence[str | None]) -> list[bool]:
    """Whether each task is given a GPU that another task on its machine is given too."""
    users: collections.Counter = collections.Counter()
    for machine, visible in zip(machine_of, devices):
        for gpu in visible.split(",") if visible else ():
            users[(machine, gpu)] += 1
    return [bool(visible) and any(users[(machine, gpu)] > 1 for gpu in visible.split(","))
            for machine, visible in zip(machine_of, devices)]
