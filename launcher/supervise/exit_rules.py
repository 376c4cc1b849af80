"""The rule of the exit-code table (launcher/exit_codes.py) that a failed attempt falls under, and
what it changes in the policy's decision between attempts. Pure.

The rule is the one for the exit code of the task the attempt's failure is charged to (blame.py),
when that task ended with a code by itself: a host lost or cut off, a stall or a start timeout is
the supervisor's own finding, and a signal has no code. `restate` gives the cause as the rule says
it (the rule named in its detail, for the console, run.json and the closing line); the policy
(policy.py) reads the rule from the cause:
- `fail` stops the run (`stop_reason`);
- `restart-free` restarts within the preemption budget (`restarts_free`), as exit code 42 does by
  default and SIGTERM from outside always does;
- `restart` restarts within --max-restarts, and is never given up as the same error without
  progress (`asks_restart`);
- `leave-out-host` leaves the task's host out, as a host cause does (`leaves_out_host`).
"""

from __future__ import annotations

import dataclasses

from launcher import exit_codes, protocol
from launcher.exit_codes import ExitCodes
from launcher.supervise import causes


def restate(cause: causes.Cause | None, table: ExitCodes) -> causes.Cause | None:
    """The cause under the table's rule for the exit code it was charged with; unchanged where no
    rule applies."""
    if cause is None or cause.kind not in (causes.PROGRAM_ERROR, causes.PREEMPTED) or cause.returncode is None:
        return cause
    rule = table.rule_for(cause.returncode)
    if rule is None:
        return cause
    preempted = rule.action == exit_codes.RESTART_FREE and rule.code == protocol.EXIT_PREEMPTED
    kind = causes.PREEMPTED if preempted else causes.PROGRAM_ERROR
    said = cause.error or f"exited with code {cause.returncode}{', preempted' if preempted else ''}"
    return dataclasses.replace(cause, kind=kind, detail=f"{said} (rule {said_rule(rule)})",
                               error=cause.error or f"exited with code {cause.returncode}", rule=rule)


def said_rule(rule: exit_codes.ExitRule) -> str:
    """'3=fail, from --exit-codes', '42=restart-free, the default'."""
    return rule.told()


def _action(cause: causes.Cause | None) -> str | None:
    return cause.rule.action if cause is not None and cause.rule is not None else None


def stop_reason(cause: causes.Cause | None) -> str | None:
    """Why the run stops now, without a restart, when the rule says `fail`; None otherwise."""
    if _action(cause) != exit_codes.FAIL:
        return None
    return f"{cause.task} exited with code {cause.rule.code}, which means: do not restart (rule {said_rule(cause.rule)})"


def restarts_free(cause: causes.Cause | None, returncode: int | None) -> bool:
    """Whether the restart is not counted in --max-restarts (within the preemption budget):
    `restart-free`, or SIGTERM from outside; without a cause, exit code 42."""
    if cause is None:
        return returncode == protocol.EXIT_PREEMPTED
    if cause.rule is not None:
        return cause.rule.action == exit_codes.RESTART_FREE
    return cause.kind == causes.PREEMPTED


def free_restart_reason(cause: causes.Cause | None) -> str:
    """What a restart not counted follows: 'preemption', or the exit code and its rule."""
    if cause is None or cause.rule is None or cause.kind == causes.PREEMPTED:
        return "preemption"
    return f"exit code {cause.rule.code} (rule {said_rule(cause.rule)})"


def asks_restart(cause: causes.Cause | None) -> bool:
    return _action(cause) == exit_codes.RESTART


def leaves_out_host(cause: causes.Cause | None) -> bool:
    return _action(cause) == exit_codes.LEAVE_OUT_HOST
