"""The trainer's schedule and throughput bookkeeping: pure, no TensorFlow, milliseconds."""

import subprocess
import sys

import pytest

from launcher import protocol
from launcher.trainer.schedule import Schedule, Throughput, TimeSplit


def schedule(**kw) -> Schedule:
    values = dict(train_steps=100, steps_per_loop=1000, log_every=20, eval_every=None, checkpoint_every=None,
                  stop_at_accuracy=None)
    return Schedule(**{**values, **kw})


def stops(s: Schedule, start: int = 0, warmup_end: int = 0) -> list[int]:
    found, step = [], start
    while step < s.train_steps:
        step = s.next_stop(step, warmup_end)
        found.append(step)
    return found


def test_training_stops_at_every_boundary_and_nowhere_else():
    assert stops(schedule()) == [20, 40, 60, 80, 100]
    assert stops(schedule(eval_every=30, checkpoint_every=50)) == [20, 30, 40, 50, 60, 80, 90, 100]
    assert stops(schedule(steps_per_loop=15, log_every=40)) == [15, 30, 40, 55, 70, 80, 95, 100]


def test_the_warm_up_end_is_a_boundary_and_a_resume_continues_the_grid():
    assert stops(schedule(), warmup_end=5) == [5, 20, 40, 60, 80, 100]
    assert stops(schedule(train_steps=70), start=33, warmup_end=38) == [38, 40, 60, 70]


def test_checkpoints_follow_their_schedule_or_else_the_evaluations():
    s = schedule(checkpoint_every=50)
    assert [s.checkpoint_due(step, evaluated=True, stopping=False) for step in (40, 50)] == [False, True]
    s = schedule()
    assert s.checkpoint_due(40, evaluated=True, stopping=False)
    assert not s.checkpoint_due(40, evaluated=False, stopping=False)
    assert s.checkpoint_due(41, evaluated=False, stopping=True)  # stopping early always saves


def test_throughput_leaves_the_warm_up_out_of_the_final_figure():
    t = Throughput(warmup_end=5)
    t.add(0, 5, 10.0)  # tracing: slow
    t.add(5, 10, 1.0)
    assert t.window_rate(global_batch_size=8) == pytest.approx(15 * 8 / 11.0)
    assert t.window_rate(global_batch_size=8) == 0.0  # a new window
    assert t.final_rate(global_batch_size=8) == pytest.approx(80.0)


def test_a_run_too_short_to_warm_up_counts_every_step():
    t = Throughput(warmup_end=5)
    t.add(0, 3, 1.5)
    assert t.final_rate(global_batch_size=4) == pytest.approx(8.0)
    assert Throughput(warmup_end=5).final_rate(4) == 0.0


def test_the_time_split_is_reported_every_interval_as_protocol_lines_of_milliseconds():
    split = TimeSplit(last_report=100.0, interval=3.0)
    assert split.add(2.0, 0.5, now=102.0) is None  # not yet due: the figures add up
    line = split.add(1.5, 1.25, now=103.5)
    assert protocol.parse_time_split(line) == (1750, 1750)
    assert split.add(1.0, 0.25, now=104.0) is None  # a new interval from the last line
    assert protocol.parse_time_split(split.add(2.0, 0.0, now=106.5)) == (2750, 250)
    assert split.report(now=107.0) is None  # nothing trained since the last line


def test_a_wait_beyond_the_call_or_below_zero_is_clamped():
    split = TimeSplit(last_report=0.0, interval=3.0)
    assert protocol.parse_time_split(split.add(1.0, 1.5, now=5.0)) == (0, 1000)
    assert protocol.parse_time_split(split.add(1.0, -0.1, now=10.0)) == (1000, 0)


def test_the_rest_of_the_time_split_is_reported_at_the_end():
    split = TimeSplit(last_report=0.0, interval=3.0)
    assert split.add(0.4, 0.1, now=0.5) is None
    assert protocol.parse_time_split(split.report(now=0.6)) == (300, 100)


def test_the_schedule_needs_no_tensorflow():
    code = "import sys, launcher.trainer.schedule; print('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
