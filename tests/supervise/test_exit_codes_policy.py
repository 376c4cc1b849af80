"""Exit codes with a meaning: the table (launcher/exit_codes.py), the cause restated under its rule
(exit_rules.py) and what the policy decides from it, fed attempts on a clock moved by hand."""

import pytest

from launcher import exit_codes
from launcher.exit_codes import DEFAULTS, ExitCodes, ExitRule, parse_mapping, parse_text
from launcher.supervise import causes, exit_rules, runrecord
from launcher.supervise.causes import Evidence, classify
from launcher.supervise.hosts import FleetView
from launcher.supervise.policy import GiveUp, Policy, ReadyLineSeen, Restart, Rules, Stop, TaskEnded, TaskRole
from launcher.supervise.summary import restart_story

WORKERS = [TaskRole("worker:0"), TaskRole("worker:1")]
USER = DEFAULTS.over(parse_text("3=fail,43=restart-free,44=restart,13=leave-out-host"))


def attempt(p: Policy, now: float, code: int) -> Stop:
    """Both workers ready at `now`; 30 s later worker:0 exits with `code`."""
    p.begin_attempt(WORKERS, now)
    p.on([ReadyLineSeen(role.name) for role in WORKERS], now)
    stop = p.on([TaskEnded("worker:0", code)], now + 30.0)[-1]
    assert isinstance(stop, Stop) and stop.status == runrecord.FAILED and stop.returncode == code
    return stop


def charged(code: int, table: ExitCodes = USER, error: str | None = None) -> causes.Cause:
    """The cause of worker:0 on h1 exiting with `code`, as the supervisor restates it under `table`."""
    return exit_rules.restate(classify(Evidence(runrecord.FAILED, "worker:0", "h1", code, error=error)), table)


def test_the_default_table_has_42_restart_free():
    assert DEFAULTS.rule_for(42) == ExitRule(42, exit_codes.RESTART_FREE, exit_codes.DEFAULT)
    assert DEFAULTS.said() == "42=restart-free (default)"
    cause = charged(42, DEFAULTS)
    assert cause.kind == causes.PREEMPTED and cause.rule == DEFAULTS.rule_for(42)
    assert cause.detail == "exited with code 42, preempted (rule 42=restart-free, the default)"
    assert cause.to_dict()["rule"] == {"code": 42, "action": "restart-free", "source": "default"}


def test_fail_stops_at_once_whatever_the_restarts_left():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=5))
    decision = p.after(attempt(p, 100.0, 3), charged(3))
    assert decision == GiveUp("worker:0 exited with code 3, which means: do not restart "
                              "(rule 3=fail, from --exit-codes)")
    assert p.restarts == 0


def test_a_code_without_a_rule_is_a_counted_restart():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=5))
    cause = charged(7)
    assert cause.rule is None and cause.detail == "exited with code 7"
    assert p.after(attempt(p, 100.0, 7), cause) == Restart("restarting all tasks (restart 1 of 5)")


def test_restart_free_is_not_counted_and_is_bounded_by_the_preemption_budget():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=1, max_preemption_restarts=2))
    cause = charged(43)
    assert cause.kind == causes.PROGRAM_ERROR and cause.rule.action == exit_codes.RESTART_FREE
    said = "exit code 43 (rule 43=restart-free, from --exit-codes)"
    assert p.after(attempt(p, 100.0, 43), cause) == Restart(f"restarting all tasks after {said} (1 of at most 2)")
    assert p.after(attempt(p, 200.0, 43), cause) == Restart(f"restarting all tasks after {said} (2 of at most 2)")
    assert p.restarts == 0
    assert p.after(attempt(p, 300.0, 43), cause) == Restart("restarting all tasks (restart 1 of 1)")


def test_42_given_another_action_is_no_longer_a_preemption():
    table = DEFAULTS.over(parse_text("42=fail"))
    cause = charged(42, table)
    assert cause.kind == causes.PROGRAM_ERROR
    assert cause.detail == "exited with code 42 (rule 42=fail, from --exit-codes)"
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=3, max_preemption_restarts=3))
    assert isinstance(p.after(attempt(p, 100.0, 42), cause), GiveUp)
    # Counted, as `restart` says.
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=3, max_preemption_restarts=3))
    counted = charged(42, DEFAULTS.over(parse_text("42=restart")))
    assert p.after(attempt(p, 100.0, 42), counted) == Restart("restarting all tasks (restart 1 of 3)")


def test_restart_is_not_given_up_as_the_same_error_without_progress():
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=3))
    asked = charged(44)
    for number in (1, 2, 3):
        assert p.after(attempt(p, 100.0 * number, 44), asked, None) == Restart(
            f"restarting all tasks (restart {number} of 3)")
    assert p.after(attempt(p, 400.0, 44), asked, None) == GiveUp()  # the restarts are spent
    # Without the rule the second of the same exits is given up.
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=3))
    plain = charged(44, DEFAULTS)
    assert isinstance(p.after(attempt(p, 100.0, 44), plain, None), Restart)
    assert p.after(attempt(p, 200.0, 44), plain, None).reason.startswith("the same error twice")


def test_leave_out_host_gives_its_tasks_to_a_spare_or_stops():
    fleet = FleetView(in_use=("h1", "h2"), spares=("h9",))
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    cause = charged(13)
    assert p.after(attempt(p, 100.0, 13), cause, fleet=fleet) == Restart(
        "restarting all tasks without h1 (restart 1 of 2)", leave_out="h1")
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    assert p.after(attempt(p, 100.0, 13), cause, fleet=FleetView(in_use=("h1", "h2"))) == GiveUp(
        "no spare host left to take the tasks of h1", left_out=("h1",))
    # This machine is never left out: a plain restart.
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=2))
    here = FleetView(in_use=("h1", "h2"), this_machine=frozenset({"h1"}), spares=("h9",))
    assert p.after(attempt(p, 100.0, 13), cause, fleet=here) == Restart("restarting all tasks (restart 1 of 2)")


def test_what_is_not_the_programs_own_exit_has_no_rule():
    table = DEFAULTS.over(parse_text("1=fail"))
    lost = classify(Evidence(runrecord.FAILED, "worker:0", "h1", 1, lost="SSH keepalives unanswered", login_ok=False))
    assert exit_rules.restate(lost, table) == lost and lost.kind == causes.HOST_LOST
    term = classify(Evidence(runrecord.FAILED, "worker:0", "h1", -15))
    assert exit_rules.restate(term, table).rule is None and exit_rules.restarts_free(term, -15)
    stalled = classify(Evidence(runrecord.STALLED, "worker:0", "h1", None))
    assert exit_rules.restate(stalled, table) == stalled
    # A program error the task reported keeps its words, and is named with its rule.
    error = charged(1, table, error="ValueError: bad config at train.py:3 in main")
    assert error.detail == "ValueError: bad config at train.py:3 in main (rule 1=fail, from --exit-codes)"
    assert error.error == "ValueError: bad config at train.py:3 in main"


def test_the_closing_line_names_the_rule():
    story = restart_story(charged(43), 0.0)
    assert "exited with code 43 (rule 43=restart-free, from --exit-codes)" in story
    assert "rule 42=restart-free, the default" in restart_story(charged(42), 0.0)


@pytest.mark.parametrize("text, message", [
    ("3", "is not CODE=ACTION"),
    ("3=stop", "'stop' is not an action"),
    ("0=fail", "out of range"),
    ("128=fail", "out of range"),
    ("x=fail", "is not an exit code"),
    ("٣=fail", "is not an exit code"),
    ("3=fail,3=restart", "exit code 3 is given twice"),
    ("", "give CODE=ACTION"),
])
def test_bad_tables_are_refused_with_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_text(text)


def test_the_spec_writes_a_mapping_and_the_command_line_wins_per_code():
    spec = parse_mapping({3: "fail", "75": "restart-free"})
    assert [str(rule) for rule in spec] == ["3=fail", "75=restart-free"]
    for bad in ({True: "fail"}, {3: ["fail"]}, {3.5: "fail"}):
        with pytest.raises(ValueError):
            parse_mapping(bad)
    table = DEFAULTS.over(spec).over(parse_text("3=restart"))
    assert table.said() == "3=restart (--exit-codes), 42=restart-free (default), 75=restart-free (spec exit_codes)"


@pytest.mark.parametrize("table, said", [
    (DEFAULTS, "worker:0 exited with code 42 (preempted); stopping all tasks"),
    (DEFAULTS.over(parse_text("42=fail")), "worker:0 exited with code 42 (rule 42=fail, from --exit-codes); stopping all tasks"),
    (DEFAULTS.over(parse_text("42=leave-out-host")),
     "worker:0 exited with code 42 (rule 42=leave-out-host, from --exit-codes); stopping all tasks"),
    (ExitCodes(), "worker:0 exited with code 42; stopping all tasks"),
])
def test_the_stop_notice_says_the_rule_in_force_for_the_exit_code(table, said):
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, max_restarts=5, exit_codes=table))
    p.begin_attempt(WORKERS, 0.0)
    p.on([ReadyLineSeen(role.name) for role in WORKERS], 0.0)
    decisions = p.on([TaskEnded("worker:0", 42)], 1.0)
    assert [d.text for d in decisions if hasattr(d, "text")] == [said]
    sidecar = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, exit_codes=USER))
    sidecar.begin_attempt([*WORKERS, TaskRole("evaluator:0", sidecar=True)], 0.0)
    decisions = sidecar.on([TaskEnded("evaluator:0", 3)], 1.0)
    assert decisions[0].text == "evaluator:0 exited with code 3 (rule 3=fail, from --exit-codes); training goes on without it"
