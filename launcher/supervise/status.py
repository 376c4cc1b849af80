"""The words a run's state is told in: the statuses run.json records and `mgpu status` shows, and
how a task's end is said. Pure and standard library only, so that the rules (policy.py,
causes.py) can speak them without importing what writes the record."""

from __future__ import annotations

import signal

from launcher import exit_codes, protocol

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
INTERRUPTED = "interrupted"
START_TIMEOUT = "start-timeout"
STALLED = "stalled"
LAUNCHER_DIED = "launcher-died"
RESIZED = "resized"  # an attempt stopped to take back hosts the run went on without (take_back.py)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int, table: exit_codes.ExitCodes = exit_codes.DEFAULTS) -> str:
    """'exited with code 3', with the rule of `table` in force for the code, if any: exit code 42
    restarted without counting is '(preempted)', any other rule is named."""
    if returncode < 0:
        return f"was killed by {signal_name(-returncode)}"
    rule = table.rule_for(returncode)
    if rule is None:
        return f"exited with code {returncode}"
    if rule.code == protocol.EXIT_PREEMPTED and rule.action == exit_codes.RESTART_FREE:
        return f"exited with code {returncode} (preempted)"
    return f"exited with code {returncode} (rule {rule.told()})"


def duration(seconds: float) -> str:
    """"41.3 s", "12 min 5 s", "21 h 4 min"."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60)} s"
    return f"{minutes // 60} h {minutes % 60} min"
