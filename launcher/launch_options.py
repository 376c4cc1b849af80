"""What `mgpu launch` was asked to do beyond the plan: how to supervise, how to reach hosts, which
checks to run. Made once by the command line, read by launch.py."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from launcher.config.spec import ClusterSpec
from launcher.plan.planner import TaskPlan

from launcher.backends.ssh.options import SshOptions
from launcher.supervise.options import SuperviseOptions


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    supervise: SuperviseOptions
    ssh: SshOptions = SshOptions()
    check_hosts: bool = True  # run mgpu check's probes on remote hosts before starting anything
    allow_public: bool = False  # no warning for workers on public addresses
    leave_out_slow: bool = False  # a host the speed probe names as slow gives its tasks to a spare before the start
    detach: bool = False  # once the run has begun, a supervisor of its own runs it and the launch returns
    spec: ClusterSpec | None = None  # what the plans were made from; with `replan`, spares can take a lost host's tasks
    replan: Callable[[ClusterSpec], Sequence[TaskPlan]] | None = None  # the planner, as the command line called it
    argv: tuple[str, ...] = ()  # the command line, for the relaunch command without a lost host
    health_check: str | None = None  # a command each host runs before it runs tasks; non-zero: it is left out
    health_check_timeout: float | None = None  # seconds the health check may take on a host; None: the default
    quarantine: float = 0.0  # seconds a host left out for a fault of its own stays in the user's quarantine; 0: none
