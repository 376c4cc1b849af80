"""How a run is supervised. Apart from the supervisor so the CLI can build it cheaply."""

from __future__ import annotations

import dataclasses
import pathlib

from launcher.backends.base import DEFAULT_GRACE_PERIOD
from launcher.supervise import pace

DEFAULT_LOG_DIR = "mgpu-runs"  # --log-dir of launch, status, logs, attach and stop

# Seconds without progress (output or CPU use from any training task) before a run counts as stalled.
DEFAULT_STALL_TIMEOUT = 1800.0
# Seconds over which the training tasks' busy shares are compared to name the one the others wait for.
DEFAULT_SLOW_WINDOW = pace.WINDOW


@dataclasses.dataclass(frozen=True)
class SuperviseOptions:
    run_id: str
    log_dir: pathlib.Path  # run files go to log_dir / run_id /
    grace_period: float = DEFAULT_GRACE_PERIOD  # TERM -> KILL, for every backend
    start_timeout: float = 120.0  # seconds for every task to become ready
    max_restarts: int = 0
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # 0: no stall watchdog
    slow_window: float = DEFAULT_SLOW_WINDOW  # seconds of busy shares compared to name the slowest task; 0: never
    timestamps: bool = False
    show: frozenset[str] | None = None  # console filter: task types ("worker") or names ("worker:1"); None = all
    show_tf_logs: bool = False  # TensorFlow's C++ INFO/WARNING records and start-up notices on the console too
    max_preemption_restarts: int = 100  # restarts after EXIT_PREEMPTED, not counted in max_restarts
    show_secrets: bool = False  # run.json shows the values of the plans' secret_env
