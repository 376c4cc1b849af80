"""Settings for remote tasks that apply to every host.

Kept apart from the modules that import paramiko, so the CLI can build them cheaply.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SshOptions:
    known_hosts: str | None = None  # extra known_hosts file, besides ~/.ssh/known_hosts
    accept_new_host_keys: bool = False  # like StrictHostKeyChecking=accept-new
    ssh_config: str | None = None  # default ~/.ssh/config
    connect_timeout: float = 10.0
    keepalive: float = 15.0  # seconds between keepalives; 3 unanswered ones drop the connection
    host_agent: bool = True  # one agent per host starts all of its tasks (backends/ssh/agent.py); False: a session per task
    debug: bool = False  # show the SSH library's log of mgpu's connections
