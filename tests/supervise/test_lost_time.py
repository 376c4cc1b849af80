"""Where a run's time went (lost_time.py): each category on a clock of plain numbers, no processes."""

import pytest

from launcher.supervise.lost_time import AttemptTimes, StepTimes, attempt_split, run_split, told


def steps(first_at, first_step, caught_up_at, last_new_at, highest, interval=0.5):
    return StepTimes(first_at, first_step, caught_up_at, last_new_at, highest, interval)


# The run: 0.5 s a step, a checkpoint every 10 steps; the first attempt fails after step 16,
# the second resumes at 10, redoes 11-16 and goes on to 20.
FIRST = AttemptTimes(started=100.0, ended=108.6, failed=True, best_before=None,
                     steps=steps(first_at=101.0, first_step=1, caught_up_at=101.0, last_new_at=108.5, highest=16))
SECOND = AttemptTimes(started=110.0, ended=115.6, failed=False, best_before=16,
                      steps=steps(first_at=110.9, first_step=11, caught_up_at=113.4, last_new_at=115.4, highest=20),
                      restart_before=1.4)


def test_a_first_attempt_splits_into_start_up_new_steps_and_the_time_after_its_last_new_step():
    split = attempt_split(FIRST)
    # Step 1's own work (a mean step, 0.5 s) is taken off the 1 s before its line.
    assert split["start_up"] == pytest.approx(0.5)
    assert split["new_steps"] == pytest.approx(0.5 + 7.5)
    assert split["after_last_step"] == pytest.approx(0.1)
    assert split["redone"] == split["stalled"] == split["finish"] == split["restart"] == 0


def test_a_restart_that_resumes_below_the_best_step_counts_the_steps_it_redoes():
    split = attempt_split(SECOND)
    # Steps 11-16: from step 11's start (0.5 s before its line) to step 16's line.
    assert split["redone"] == pytest.approx(3.0)
    assert split["start_up"] == pytest.approx(0.4)
    assert split["new_steps"] == pytest.approx(2.0)
    assert split["finish"] == pytest.approx(0.2)
    assert split["restart"] == pytest.approx(1.4)
    assert split["after_last_step"] == 0


def test_a_failed_restart_that_never_passes_the_best_step_loses_all_of_it():
    attempt = AttemptTimes(started=0.0, ended=10.0, failed=True, best_before=50,
                           steps=steps(first_at=2.0, first_step=41, caught_up_at=None, last_new_at=None, highest=48))
    split = attempt_split(attempt)
    assert split["new_steps"] == 0
    assert split["start_up"] == pytest.approx(1.5)
    assert split["redone"] == pytest.approx(8.5)


def test_a_stall_is_the_time_without_activity_before_the_stop_and_not_more_than_the_attempt_had_left():
    attempt = AttemptTimes(started=0.0, ended=100.0, failed=True, best_before=None,
                           steps=steps(first_at=1.0, first_step=1, caught_up_at=1.0, last_new_at=20.0, highest=39),
                           stalled_for=60.0)
    split = attempt_split(attempt)
    assert split["stalled"] == pytest.approx(60.0)
    assert split["after_last_step"] == pytest.approx(20.0)
    longer = attempt_split(AttemptTimes(**{**attempt.__dict__, "stalled_for": 500.0}))
    assert longer["stalled"] == pytest.approx(80.0) and longer["after_last_step"] == 0


def test_an_attempt_without_step_lines_that_failed_is_all_start_up_or_stall():
    split = attempt_split(AttemptTimes(0.0, 30.0, failed=True, best_before=None, steps=None, stalled_for=10.0))
    assert (split["start_up"], split["stalled"], split["new_steps"]) == (pytest.approx(20.0), 10.0, 0)


def test_the_run_adds_its_attempts_the_time_before_the_first_and_after_the_last_and_says_goodput():
    totals = run_split([FIRST, SECOND], run_started=99.8, now=115.7)
    lost = totals["lost_s"]
    assert totals["wall_s"] == pytest.approx(15.9)
    assert lost["start_up"] == pytest.approx(0.2 + 0.5 + 0.4)
    assert lost["redone"] == pytest.approx(3.0)
    assert lost["restart"] == pytest.approx(1.4)
    assert lost["finish"] == pytest.approx(0.2 + 0.1)
    assert totals["new_steps_s"] == pytest.approx(10.0)
    assert totals["time_lost_s"] == pytest.approx(5.9)
    assert totals["goodput"] == pytest.approx(10.0 / 15.9, abs=1e-4)
    # Every second of the wall is in one place.
    assert totals["time_lost_s"] + totals["new_steps_s"] == pytest.approx(totals["wall_s"])


def test_goodput_is_unknown_when_no_attempt_reported_a_step():
    failed = AttemptTimes(0.0, 5.0, failed=True, best_before=None, steps=None)
    ended = AttemptTimes(6.0, 20.0, failed=False, best_before=None, steps=None, restart_before=1.0)
    totals = run_split([failed, ended], run_started=0.0, now=20.0)
    assert totals["goodput"] is None and totals["new_steps_s"] is None
    assert totals["time_lost_s"] == pytest.approx(6.0)  # the failure and the restart; the rest unknown
    assert told(totals) == "goodput unknown (no steps reported); 6.0 s lost: 5.0 s start-up, 1.0 s restart"


def test_the_costs_are_told_in_a_few_words_and_what_is_not_a_number_is_left_out():
    totals = run_split([FIRST, SECOND], run_started=99.8, now=115.7)
    assert told(totals) == ("goodput 63%; 5.9 s lost: 1.1 s start-up, 3.0 s redone, 0.1 s after-last-step, "
                            "1.4 s restart, 0.3 s finish")
    hostile = {"goodput": "1e309", "time_lost_s": True, "lost_s": {"redone": "\x1b[2J", "restart": 2.0}}
    assert told(hostile) == "goodput unknown (no steps reported)"
    assert told({"goodput": 0.5, "time_lost_s": 2.0, "lost_s": ["x"]}) == "goodput 50%; 2.0 s lost"
