"""The cluster spec: which tasks run where, and how to reach their hosts."""

from __future__ import annotations

import dataclasses
from typing import Mapping

CHIEF = "chief"
WORKER = "worker"
EVALUATOR = "evaluator"
ROLES = (CHIEF, WORKER, EVALUATOR)  # also the order tasks are planned and shown in


@dataclasses.dataclass(frozen=True)
class SshSettings:
    """How to log into one host. None means: ask ~/.ssh/config, then the defaults."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None

    def merged_over(self, defaults: "SshSettings") -> "SshSettings":
        """These settings, with gaps filled from `defaults`."""
        return SshSettings(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
                for f in dataclasses.fields(self)
            }
        )


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: its role and where it runs. An evaluator has no port (it is not in the cluster)."""

    role: str
    host: str
    port: int | None
    ssh: SshSettings = SshSettings()


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    tasks: tuple[TaskSpec, ...]
    # The program each task runs; None means the built-in trainer.
    command: tuple[str, ...] | None = None
    # Arguments for the built-in trainer (only when command is None).
    trainer_args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    # The interpreter that runs the built-in trainer; None means the launcher's own (local tasks)
    # or "python3" (remote tasks).
    python: str | None = None
    threads_per_task: int | None = None
    gpus_per_task: int | None = None
