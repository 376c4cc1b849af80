"""The per-task restart of parameter-server training (`--worker-restarts N`): a worker that fails is
started again in place, within the same attempt, while the chief and the parameter servers go on.
Pure, as the policy is: it decides, the supervisor restarts (Attempt.restart_task).

TensorFlow's ClusterCoordinator (ParameterServerStrategy's chief) is built for this: it runs a lost
worker's functions on the other workers, and once a worker serves at its address again, it builds
the worker's datasets anew and gives it functions again. The chief holds the training loop and the
parameter servers the variables, so neither is restarted in place: their failure ends the attempt
(and restarts the whole cluster within --max-restarts). Only a worker of a cluster with parameter
servers serves so (`TaskRole.serves`, the workers and ps of a run with a ps task).
"""

from __future__ import annotations

import dataclasses

from launcher.supervise.status import describe_exit

WORKER = "worker"


@dataclasses.dataclass(frozen=True)
class RestartTask:
    """Start the task again in place, in the same attempt; the other tasks go on."""
    name: str


class InPlaceRestarts:
    """The run's budget of in-place restarts of parameter-server workers, all workers together."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0

    def restart(self, name: str, returncode: int, serves: bool) -> tuple[str, RestartTask] | None:
        """The notice and the decision that restart the failed task `name` in place, or None where it
        is not a parameter-server worker or the budget is spent (the attempt then stops)."""
        if not serves or name.split(":")[0] != WORKER or self.used >= self.budget:
            return None
        self.used += 1
        return (f"{name} {describe_exit(returncode)}; restarting it in place, the chief and the ps tasks going on "
                f"(worker restart {self.used} of {self.budget})", RestartTask(name))
