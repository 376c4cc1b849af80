"""What `mgpu launch` was asked to do beyond the plan: how to supervise, how to reach hosts, which
checks to run. Made once by the command line, read by launch.py."""

from __future__ import annotations

import dataclasses

from launcher.backends.ssh.options import SshOptions
from launcher.supervise.options import SuperviseOptions


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    supervise: SuperviseOptions
    ssh: SshOptions = SshOptions()
    check_hosts: bool = True  # run mgpu check's probes on remote hosts before starting anything
    allow_public: bool = False  # no warning for workers on public addresses
    detach: bool = False  # once the run has begun, a supervisor of its own runs it and the launch returns
