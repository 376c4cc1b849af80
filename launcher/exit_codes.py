"""What a task's exit code means to the supervisor: the table of `--exit-codes CODE=ACTION,...`
(spec `exit_codes:`), over the defaults.

A program says why it ended by its exit code; the supervisor acts on the rule for that code when
the task it charges with an attempt's failure ended with it:
- `restart`: restart the cluster, counted in --max-restarts (as any failure, but never given up as
  the same error without progress: the program asked to be started again);
- `restart-free`: restart the cluster without counting it in --max-restarts, up to the preemption
  budget (the default for exit code 42, protocol.EXIT_PREEMPTED: preempted, its checkpoint saved);
- `fail`: stop the run now, without a restart (the program's own "my configuration is wrong");
- `leave-out-host`: leave the task's host out for the rest of the run, its tasks going to a spare
  (or the run stops), and restart, counted (the program found its host unfit).
A code without a rule is a failure of the program like any other.

Standard library only: the command line, the spec file and the supervisor share it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from launcher import protocol

RESTART = "restart"
RESTART_FREE = "restart-free"
FAIL = "fail"
LEAVE_OUT_HOST = "leave-out-host"
ACTIONS = (RESTART, RESTART_FREE, FAIL, LEAVE_OUT_HOST)

# Where a rule came from, as run.json and the console say it.
DEFAULT = "default"
COMMAND_LINE = "--exit-codes"
SPEC = "spec exit_codes"

# 0 is success; 128 and above are what shells report for signals (and what mgpu itself exits with
# when interrupted), which a program does not choose.
MIN_CODE, MAX_CODE = 1, 127
MAX_RULES = MAX_CODE


@dataclasses.dataclass(frozen=True)
class ExitRule:
    code: int
    action: str  # one of ACTIONS
    source: str = DEFAULT  # DEFAULT, COMMAND_LINE or SPEC

    def __str__(self) -> str:
        return f"{self.code}={self.action}"

    def told(self) -> str:
        """The rule with where it came from, in a sentence: '3=fail, from --exit-codes'."""
        return f"{self}, {'the default' if self.source == DEFAULT else 'from ' + self.source}"

    def said(self) -> str:
        """The rule with where it came from: '42=restart-free (default)'."""
        return f"{self} ({self.source})"

    def to_dict(self) -> dict:
        return {"code": self.code, "action": self.action, "source": self.source}


@dataclasses.dataclass(frozen=True)
class ExitCodes:
    """The rules in force, one per code, in the order of their codes."""

    rules: tuple[ExitRule, ...] = ()

    def rule_for(self, returncode: int | None) -> ExitRule | None:
        """The rule for a task's exit (negative: a signal, which has none)."""
        return next((rule for rule in self.rules if rule.code == returncode), None)

    def over(self, rules: Iterable[ExitRule]) -> ExitCodes:
        """These rules with `rules` in place of those for the same codes."""
        merged = {rule.code: rule for rule in self.rules}
        merged.update((rule.code, rule) for rule in rules)
        return ExitCodes(tuple(merged[code] for code in sorted(merged)))

    def said(self) -> str:
        """One line: '3=fail (--exit-codes), 42=restart-free (default)'."""
        return ", ".join(rule.said() for rule in self.rules) or "none"

    def to_list(self) -> list[dict]:
        return [rule.to_dict() for rule in self.rules]


DEFAULTS = ExitCodes((ExitRule(protocol.EXIT_PREEMPTED, RESTART_FREE),))


def parse_rule(code: object, action: object, source: str) -> ExitRule:
    """One rule; ValueError saying what is wrong with it."""
    text = str(code).strip()
    if isinstance(code, bool) or not (isinstance(code, int) or text.isascii() and text.isdigit()):
        raise ValueError(f"{code!r} is not an exit code (a whole number from {MIN_CODE} to {MAX_CODE})")
    number = int(text)
    if not MIN_CODE <= number <= MAX_CODE:
        raise ValueError(f"exit code {number} is out of range: give {MIN_CODE} to {MAX_CODE} "
                         f"(0 is success; 128 and above are signals)")
    if not isinstance(action, str) or action.strip() not in ACTIONS:
        shown = action if isinstance(action, (str, int, float)) else type(action).__name__
        raise ValueError(f"exit code {number}: {str(shown)[:40]!r} is not an action ({', '.join(ACTIONS)})")
    return ExitRule(number, action.strip(), source)


def _checked(rules: list[ExitRule]) -> tuple[ExitRule, ...]:
    codes = [rule.code for rule in rules]
    twice = sorted({code for code in codes if codes.count(code) > 1})
    if twice:
        raise ValueError(f"exit code {twice[0]} is given twice")
    return tuple(rules)


def parse_text(text: str, source: str = COMMAND_LINE) -> tuple[ExitRule, ...]:
    """`CODE=ACTION,...` as the command line writes it: '3=fail,75=restart-free'."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or len(items) > MAX_RULES:
        raise ValueError(f"give CODE=ACTION,... with at most {MAX_RULES} codes, e.g. 3=fail,75=restart-free")
    rules = []
    for item in items:
        code, equals, action = item.partition("=")
        if not equals:
            raise ValueError(f"{item[:40]!r} is not CODE=ACTION (actions: {', '.join(ACTIONS)})")
        rules.append(parse_rule(code, action, source))
    return _checked(rules)


def parse_mapping(value: Mapping, source: str = SPEC) -> tuple[ExitRule, ...]:
    """`exit_codes:` as a spec file writes it: a mapping of codes to actions."""
    if len(value) > MAX_RULES:
        raise ValueError(f"at most {MAX_RULES} codes")
    return _checked([parse_rule(code, action, source) for code, action in value.items()])
