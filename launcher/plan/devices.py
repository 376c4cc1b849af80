"""How the GPUs of a host are given to its tasks, as CUDA_VISIBLE_DEVICES. Pure: GPU counts are passed in.

One rule for every framework, decided by what mgpu knows of the program:

- The split (each task its own share of the host's GPUs) where the program is a TensorFlow one,
  which uses every GPU it sees: the built-in trainer, `--legacy-keras`, and wherever the user asks
  for it with `--gpus-per-task K`. TensorFlow's MultiWorkerMirroredStrategy and JAX with several
  processes on a host need it.
- Every GPU for any other program: each task sees all of its host's GPUs and picks one by
  LOCAL_RANK, as under torchrun, accelerate, DeepSpeed and horovodrun; a torchrun-style program
  calls `torch.cuda.set_device(LOCAL_RANK)`, which fails when it sees one GPU numbered 0.

Either way, tasks that share a GPU grow their memory instead of taking it all (SHARED_GPU_ENV).
A host without GPUs hides them ("") and a remote host's GPUs, not counted before the launch, are
left as the host has them, unless `--gpus-per-task` says how many each task takes.
"""

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


SPLIT, EVERY_GPU = "split", "every GPU"


def gpu_rule(runs_trainer: bool, legacy_keras: bool, gpus_per_task: int | None) -> tuple[str, str]:
    """(rule, why) for a run's tasks: SPLIT or EVERY_GPU, and the reason in the words of the command line."""
    if gpus_per_task is not None:
        return SPLIT, f"--gpus-per-task {gpus_per_task}"
    if runs_trainer:
        return SPLIT, "the built-in trainer (TensorFlow): each task its own GPUs"
    if legacy_keras:
        return SPLIT, "--legacy-keras (TensorFlow): each task its own GPUs"
    return EVERY_GPU, ("a program of its own: each task sees every GPU of its host and LOCAL_RANK picks one, as under "
                       "torchrun; TensorFlow and JAX programs with several tasks on a host need --gpus-per-task K")


NO_GPU_HERE = "none: this host has no GPU"
UNCOUNTED = "as the host has them: its GPUs are not counted before the launch (--gpus-per-task K splits them)"


def task_gpu_rule(rule: str, visible: str | None, gpus_per_task: int | None) -> str:
    """What the dry run says of one task's GPUs: `rule` (gpu_rule's, as one line) unless its host has none
    or was not counted."""
    if gpus_per_task is None and visible == NO_GPUS:
        return NO_GPU_HERE
    if gpus_per_task is None and visible is None and not rule.startswith(EVERY_GPU):
        return UNCOUNTED
    return rule


def every_gpu(devices: Sequence[str | None]) -> list[str | None]:
    """The split's CUDA_VISIBLE_DEVICES under EVERY_GPU: every GPU (left alone) where a task had a share,
    none ("") where its host has none."""
    return [NO_GPUS if visible == NO_GPUS else None for visible in devices]


def shares_every_gpu(machine_of: Sequence[str], devices: Sequence[str | None]) -> list[bool]:
    """Under EVERY_GPU: whether a task shares its host's GPUs with another task (the split gave it a share)."""
    tasks_on = collections.Counter(machine_of)
    return [bool(visible) and tasks_on[machine] > 1 for machine, visible in zip(machine_of, devices)]


def shares_a_gpu(machine_of: Sequence[str], devices: Sequence[str | None]) -> list[bool]:
    """Whether each task is given a GPU that another task on its machine is given too."""
    users: collections.Counter = collections.Counter()
    for machine, visible in zip(machine_of, devices):
        for gpu in visible.split(",") if visible else ():
            users[(machine, gpu)] += 1
    return [bool(visible) and any(users[(machine, gpu)] > 1 for gpu in visible.split(","))
            for machine, visible in zip(machine_of, devices)]
