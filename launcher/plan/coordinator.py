"""The job's coordinator: its first member, the chief when there is one, else worker 0. Pure: no I/O.

That is process 0 for JAX and PyTorch (job_env.py numbers the processes in JOB_ROLES order), whose
port the other processes connect to; TensorFlow's tasks each listen on their own port instead. The
planner works it out once and every task's plan carries it: the job's variables, and whatever
watches for a task joining its cluster, read it there.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from launcher.config.addresses import format_address
from launcher.config.spec import CHIEF, WORKER, TaskSpec

# The order of the job's processes: the chief, when there is one, is process 0 and so the coordinator.
JOB_ROLES = (CHIEF, WORKER)


@dataclasses.dataclass(frozen=True)
class Coordinator:
    address: str  # where the other tasks reach it: a host name or an IP address, without brackets
    port: int

    def __str__(self) -> str:
        """host:port, an IPv6 address in brackets (as in TF_CONFIG)."""
        return format_address(self.address, self.port)


def find_coordinator(tasks: Sequence[TaskSpec], addresses: Mapping[str, str]) -> Coordinator | None:
    """The first member of the job among `tasks`, at the address the others reach its host at
    (`addresses`, else its host name); None for a job without members."""
    for role in JOB_ROLES:
        first = next((task for task in tasks if task.role == role), None)
        if first is not None:
            return Coordinator(addresses.get(first.host, first.host), first.port)
    return None
