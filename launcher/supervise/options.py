"""How a run is supervised. Apart from the supervisor so the CLI can build it cheaply.

Each setting is declared once, here: the policy's rules (`rules()`) and what run.json records of
the settings (`recorded()`, the fields marked RECORDED) are read from these fields."""

from __future__ import annotations

import dataclasses
import pathlib

from launcher.backends.base import DEFAULT_GRACE_PERIOD
from launcher.exit_codes import DEFAULTS as DEFAULT_EXIT_CODES, ExitCodes
from launcher.supervise import pace, policy

DEFAULT_LOG_DIR = "mgpu-runs"  # --log-dir of launch, status, logs, attach and stop

# Seconds without progress (output or CPU use from any training task) before a run counts as stalled.
DEFAULT_STALL_TIMEOUT = 1800.0
# Seconds over which the training tasks' busy shares are compared to name the one the others wait for.
DEFAULT_SLOW_WINDOW = pace.WINDOW
# Seconds between probes of a host left out with no spare (--min-hosts), to take it back.
DEFAULT_REJOIN_INTERVAL = 300.0


RECORDED = {"recorded": True}  # the field's value goes to run.json's "options"


@dataclasses.dataclass(frozen=True)
class SuperviseOptions:
    run_id: str
    log_dir: pathlib.Path = dataclasses.field(metadata=RECORDED)  # run files go to log_dir / run_id /
    grace_period: float = dataclasses.field(default=DEFAULT_GRACE_PERIOD, metadata=RECORDED)  # TERM -> KILL
    # Seconds for every task to become ready.
    start_timeout: float = dataclasses.field(default=120.0, metadata=RECORDED)
    max_restarts: int = dataclasses.field(default=0, metadata=RECORDED)
    # The fewest hosts the run goes on with when a host left out has no spare (0: it stops the run).
    min_hosts: int = dataclasses.field(default=0, metadata=RECORDED)
    # Seconds between probes of a host the run went on without, to take it back (0: never).
    rejoin_interval: float = dataclasses.field(default=DEFAULT_REJOIN_INTERVAL, metadata=RECORDED)
    stall_timeout: float = dataclasses.field(default=DEFAULT_STALL_TIMEOUT, metadata=RECORDED)  # 0: no watchdog
    # Seconds of busy shares compared to name the slowest task; 0: never.
    slow_window: float = dataclasses.field(default=DEFAULT_SLOW_WINDOW, metadata=RECORDED)
    timestamps: bool = False
    show: frozenset[str] | None = None  # console filter: task types ("worker") or names ("worker:1"); None = all
    show_tf_logs: bool = False  # TensorFlow's C++ INFO/WARNING records and start-up notices on the console too
    # Restarts after EXIT_PREEMPTED, not counted in max_restarts.
    max_preemption_restarts: int = dataclasses.field(default=100, metadata=RECORDED)
    show_secrets: bool = False  # run.json shows the values of the plans' secret_env
    # What each exit code of a task means (launcher/exit_codes.py): the defaults, the spec's, --exit-codes.
    exit_codes: ExitCodes = dataclasses.field(default=DEFAULT_EXIT_CODES, metadata=RECORDED)
    # Where word of the run's events goes (notify.py): a shell command, a URL. Not recorded: a URL or a
    # command line often holds a token.
    notify: str | None = None
    notify_url: str | None = None
    # TensorBoard event files of the run go under tensorboard / "mgpu" (tensorboard.py); None: none.
    tensorboard: pathlib.Path | None = dataclasses.field(default=None, metadata=RECORDED)
    # Parameter-server workers restarted in place, the chief and ps going on (in_place.py); 0: none.
    worker_restarts: int = dataclasses.field(default=0, metadata=RECORDED)
    # `mgpu launch`'s arguments as given, its secrets hidden (cli/command_line.py), for run.json and the report.
    command_line: tuple[str, ...] = dataclasses.field(default=(), metadata=RECORDED)

    def rules(self) -> policy.Rules:
        """The policy's rules, from these settings."""
        return policy.Rules(**{f.name: getattr(self, f.name) for f in dataclasses.fields(policy.Rules)})

    def recorded(self) -> dict:
        """The settings run.json records (paths as text)."""
        return {f.name: _recorded(getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata.get("recorded")}


def _recorded(value):
    if isinstance(value, pathlib.Path):
        return str(value)
    return value.to_list() if isinstance(value, ExitCodes) else value
