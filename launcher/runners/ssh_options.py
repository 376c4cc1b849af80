"""Settings for remote tasks that apply to every host.

Kept apart from runners/ssh.py so the CLI can build them without importing paramiko.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class SshOptions:
    known_hosts: str | None = None  # extra known_hosts file, besides ~/.ssh/known_hosts
    accept_new_host_keys: bool = False  # like StrictHostKeyChecking=accept-new
    ssh_config: str | None = None  # default ~/.ssh/config
    connect_timeout: float = 10.0
    keepalive: float = 15.0  # seconds between keepalives; 3 unanswered ones drop the connection
    # Seconds a remote task group gets between SIGTERM and SIGKILL when its SSH session ends.
    kill_grace: int = 5


def ssh_options_from(opts: Mapping[str, object]) -> SshOptions:
    """SshOptions from the CLI's parsed options; missing ones keep their defaults."""
    defaults = SshOptions()
    grace = opts.get("grace_period")
    return SshOptions(
        known_hosts=opts.get("known_hosts") or None,
        accept_new_host_keys=bool(opts.get("accept_new_host_keys")),
        ssh_config=opts.get("ssh_config") or None,
        connect_timeout=float(opts.get("connect_timeout") or defaults.connect_timeout),
        kill_grace=math.ceil(grace) if grace is not None else defaults.kill_grace,
    )
