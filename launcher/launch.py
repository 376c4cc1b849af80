"""Executing a plan: claim the run id, check that the run can start, make the run's hosts ready (a
Fleet: launcher/fleet/), then supervise."""

from __future__ import annotations

import os
import shlex
from typing import Callable, Sequence

from launcher.config.slurm_env import read_allocation
from launcher.fleet.fleet import MachineFleet, SlurmFleet
from launcher.launch_options import LaunchOptions
from launcher.plan.planner import TaskPlan
from launcher.preflight.run_id import check_run_id_unused
from launcher.supervise import detach, run_lock
from launcher.supervise.options import DEFAULT_LOG_DIR
from launcher.supervise.rundir import CONSOLE_LOG, check_run_dir
from launcher.supervise.supervisor import supervise


def launch(plans: Sequence[TaskPlan], options: LaunchOptions) -> int:
    """Run the plans to their end; the exit code of `mgpu launch` when it ends without an error (0,
    or for a detached launch the code of its supervisor if that ended before the run began)."""
    detached = None
    if options.detach:
        forked = detach.fork()
        if isinstance(forked, int):
            if forked == 0:
                _announce(options)
            return forked
        detached = forked.let_go
    # The run id stays claimed on this machine from the check that no process carries it until the
    # run's last sweep is done.
    with run_lock.claimed(options.supervise.run_id):
        # A run id or log dir that cannot be used fails before any connection.
        check_run_dir(options.supervise)
        check_run_id_unused(options.supervise.run_id)
        _launch(plans, options, detached)
    return 0


def _announce(options: LaunchOptions) -> None:
    """What a detached launch prints once its run has begun: the run id and how to follow it."""
    run_id = options.supervise.run_id
    log_dir = options.supervise.log_dir
    where = "" if str(log_dir) == DEFAULT_LOG_DIR else f" --log-dir {shlex.quote(str(log_dir))}"
    detach.announce(f"mgpu: run {run_id} goes on detached; its console is in {log_dir / run_id / CONSOLE_LOG}\n"
                    f"  mgpu status {run_id}{where}        its state and progress\n"
                    f"  mgpu logs {run_id}{where} -f       follow its console to the end\n"
                    f"  mgpu attach {run_id}{where}        its live console (Ctrl-C leaves it running)\n"
                    f"  mgpu stop {run_id}{where}          stop it")


def _launch(plans: Sequence[TaskPlan], options: LaunchOptions, detached: Callable[[], None] | None) -> None:
    """The run's hosts made ready (the fleet's first start), then supervised with the fleet to answer
    for them between attempts."""
    slurm = any(plan.slurm_rank is not None for plan in plans)
    # Every task of a Slurm run is in one srun step of the allocation this launcher runs in.
    fleet = SlurmFleet(plans, options, read_allocation(os.environ).nodes) if slurm else MachineFleet(plans, options)
    try:
        plans = fleet.start()
    except BaseException:
        fleet.close()
        raise
    backend = fleet.backend()
    try:
        supervise(plans, backend, options.supervise, detach=detached, run_dir=fleet.run_dir, hosts=fleet)
    finally:
        backend.close()
