"""The one place that imports the SSH side (paramiko): a run on this machine alone never needs it,
and paramiko takes a tenth of a second to import."""

from __future__ import annotations

from typing import Sequence

from launcher.backends.base import DEFAULT_GRACE_PERIOD
from launcher.backends.ssh.options import SshOptions
from launcher.plan.planner import TaskPlan


def make_ssh_backend(options: SshOptions, grace_period: float = DEFAULT_GRACE_PERIOD):
    """An SSH backend; with options.debug, the log of its connections is shown too."""
    from launcher.backends.ssh import backend as ssh_backend_module, transport
    if options.debug:
        transport.enable_debug_logging()
    return ssh_backend_module.SshBackend(options, grace_period)


def sync_to_hosts(plans: Sequence[TaskPlan], ssh_backend) -> None:
    """The --sync folder to the hosts of the remote plans, over SFTP."""
    from launcher.fleet.sync import sync_to_hosts as sync
    sync(plans, ssh_backend)
