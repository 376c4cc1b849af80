"""Planning: a cluster spec becomes one TaskPlan per task. Pure functions, no I/O.

Dry-run renders the plan; launch executes the same plan.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

from launcher.spec import SshSettings


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """Everything needed to start one task, on this machine or over SSH."""

    type: str  # chief | worker | evaluator
    index: int
    host: str
    port: int | None  # None for the evaluator, which is not in the cluster
    local: bool
    ssh: SshSettings | None  # None for a local task
    argv: tuple[str, ...]
    env: Mapping[str, str]  # what the launcher adds to the base environment, TF_CONFIG included
    workdir: str | None
    waits_for_ready: bool  # True when the program speaks the readiness protocol

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def tf_config(self) -> dict:
        return json.loads(self.env["TF_CONFIG"])
