"""That no live process carries the run id: the end of a run stops every process of this user
that carries its id (whatever its log dir), so a run must not start under an id others carry.

Checked under the run id's claim on this machine (supervise/run_lock.py), which the launch holds
from before this check until its last sweep: a launch that starts at the same time sees the claim
rather than no process yet.
"""

from __future__ import annotations

from launcher.errors import UsageError
from launcher.host import proctree
from launcher.supervise import run_lock


def check_run_id_unused(run_id: str) -> None:
    """Raise UsageError naming the live processes of this user that carry `run_id`."""
    with run_lock.claimed(run_id):
        holders = proctree.tagged_processes(run_id)
    if holders:
        pids = ", ".join(str(p.pid) for p in holders[:5]) + (", ..." if len(holders) > 5 else "")
        raise UsageError(f"run id {run_id} is in use by running processes (pid {pids}); choose another run id")
