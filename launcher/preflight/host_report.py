"""What the checks found of one host: a row of `mgpu check`'s table, with what the launch keeps of
it (the check's session for the hand-over, the reachability and speed answers)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from launcher.errors import MgpuError

if TYPE_CHECKING:
    from launcher.backends.ssh.handover import Handover


@dataclasses.dataclass
class HostReport:
    host: str
    tasks: tuple[str, ...]
    ssh: str = "-"  # "ok", "local", or "failed"
    python: str = "-"
    tensorflow: str = "-"
    tf_keras: str = "-"  # checked only when tasks run with --legacy-keras
    ports: str = "-"
    gpus: str = "-"
    py_spy: str | None = None  # where py-spy is (`mgpu stacks`); "": not there; None: not asked
    health: str = "-"  # the --health-check's verdict: "ok" or "failed"; "-": not asked, or not reached
    speed: str = "-"  # the speed probe's figures, with the slow ones named (mgpu check)
    problems: list[str] = dataclasses.field(default_factory=list)
    error: MgpuError | None = None  # a connection error, kept to re-raise with its type
    reached: dict | None = None  # the reachability test's answer, when it ran in the check's session
    measured: dict | None = None  # the speed probe's answer, when it ran in the check's session
    handover: Handover | None = None  # the check's session, kept to start the host's first task
    interpreter: str = "-"  # the path of the Python that runs the tasks' own program, where it is one
    imports: tuple[str, ...] = ()  # the modules that program imports at its top level
    own_name: dict | None = None  # the host's own name and what its resolver gives for it
    keras_backend: str | None = None  # the Keras backend the program's script sets for itself

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str:
        return "; ".join(self.problems) if self.problems else "ok"
