"""GPU detection and the CUDA_VISIBLE_DEVICES split between tasks on one host."""

from __future__ import annotations

import subprocess

from launcher.errors import UsageError

DETECT_TIMEOUT = 10.0
# The value that hides every GPU. "-1" rather than "" because empty values are
# easily lost when an environment is passed through a shell or SSH.
NO_GPUS = "-1"


def count_gpus_in_listing(text: str) -> int:
    """The number of GPUs in the output of `nvidia-smi -L` ("GPU 0: ... (UUID: ...)" per line)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


def detect_gpus(timeout: float = DETECT_TIMEOUT) -> int:
    """How many NVIDIA GPUs this machine has; 0 if nvidia-smi is missing, fails or hangs."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if done.returncode != 0:
        return 0
    return count_gpus_in_listing(done.stdout)


def assign_visible_devices(gpu_count: int, tasks_on_host: int, gpus_per_task: int | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each task on one host, in the order of the tasks there.

    gpu_count: GPUs on the host (from detect_gpus or the remote equivalent).
    tasks_on_host: how many tasks of the run share the host.
    gpus_per_task: None to split the host's GPUs evenly (every task gets
        gpu_count // tasks_on_host; None for each task when the host has no GPU,
        meaning: leave CUDA_VISIBLE_DEVICES alone); 0 to hide every GPU ("-1");
        k > 0 for k GPUs per task, consecutive, task i getting i*k .. i*k+k-1.

    Pure; raises UsageError when the host has too few GPUs.
    """
    if tasks_on_host < 0 or gpu_count < 0:
        raise ValueError("counts must not be negative")
    if gpus_per_task is not None and gpus_per_task < 0:
        raise UsageError(f"--gpus-per-task must be 0 or more, not {gpus_per_task}")
    if gpus_per_task == 0:
        return [NO_GPUS] * tasks_on_host
    if gpus_per_task is None:
        if gpu_count == 0:
            return [None] * tasks_on_host
        if gpu_count < tasks_on_host:
            raise UsageError(
                f"{tasks_on_host} tasks share a host with {gpu_count} GPUs; "
                "pass --gpus-per-task 0 to run them on the CPU"
            )
        gpus_per_task = gpu_count // tasks_on_host
    if gpus_per_task * tasks_on_host > gpu_count:
        raise UsageError(
            f"{tasks_on_host} tasks x {gpus_per_task} GPUs each need {gpus_per_task * tasks_on_host} GPUs; "
            f"the host has {gpu_count}"
        )
    return [
        ",".join(str(i * gpus_per_task + g) for g in range(gpus_per_task)) for i in range(tasks_on_host)
    ]
