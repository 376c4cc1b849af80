"""Which port a task's cluster is coordinated on. Pure: no I/O.

The coordinator is the first member of the cluster: the chief when there is one, else worker 0.
That is process 0 for JAX and PyTorch (keras_env.py orders the processes the same way), whose
port the other processes connect to; TensorFlow's tasks each listen on their own port instead.
"""

from __future__ import annotations

from launcher.config.addresses import parse_endpoint
from launcher.config.spec import CHIEF, WORKER
from launcher.plan.planner import TaskPlan


def coordinator_port(plan: TaskPlan) -> int | None:
    """The port of the first cluster member in the task's TF_CONFIG; None without one."""
    cluster = plan.env.cluster
    for role in (CHIEF, WORKER):
        members = cluster.get(role) if isinstance(cluster, dict) else None
        if members:
            try:
                return parse_endpoint(str(members[0])).port
            except ValueError:
                return None
    return None
