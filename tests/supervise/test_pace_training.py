"""The pace rule judges training, not start-up (supervise/pace.py, Training), with a clock moved by
hand: shares count once every task is ready (or reports progress) and training shows, by progress
lines, time splits, or steady CPU samples with every task at work."""

from launcher.supervise import pace
from launcher.supervise.pace import Seen, Training

TWO = {"worker:0": "h1", "worker:1": "h2"}


class Job:
    """Two or more tasks' cumulative runnable seconds, sampled every SAMPLE_INTERVAL."""

    def __init__(self, rule, hosts=TWO):
        self.rule = rule
        self.now = 0.0
        self.runnable = dict.fromkeys(hosts, 0.0)
        self.named: list[tuple[float, pace.Slowest]] = []

    def run(self, seconds, shares, ready=True, progressed=False, drops=()):
        """`shares` of a core each task is busy; tasks in `drops` lose a process (and its time) every sample."""
        end = self.now + seconds
        while self.now < end:
            self.now += pace.SAMPLE_INTERVAL
            for name, share in shares.items():
                self.runnable[name] += share * pace.SAMPLE_INTERVAL
                if name in drops:  # a compiler process ended: its CPU time leaves the sum
                    self.runnable[name] -= 1.5 * pace.SAMPLE_INTERVAL
                self.rule.see(name, Seen(ready, progressed, cpu=(self.now, self.runnable[name])), self.now)
            found = self.rule.slowest(self.now)
            if found is not None:
                self.named.append((self.now, found))
        return self


# DeepSpeed's start-up in a two-task run: each rank builds an op in turn while the other waits on
# the build's lock; then training, even.
COMPILE_0 = {"worker:0": 1.0, "worker:1": 0.01}
COMPILE_1 = {"worker:0": 0.01, "worker:1": 1.0}
EVEN = {"worker:0": 0.7, "worker:1": 0.72}


def test_a_start_up_compile_on_one_rank_then_the_other_names_nobody():
    job = Job(Training(TWO)).run(90, COMPILE_0).run(90, COMPILE_1)
    assert job.rule.began is None and job.rule.shares(job.now) == (pace.CPU, {})
    job.run(300, EVEN)
    assert job.named == []
    assert job.rule.began is not None and 180 < job.rule.began <= 180 + (pace.STEADY_SAMPLES + 1) * pace.SAMPLE_INTERVAL
    assert set(job.rule.shares(job.now)[1]) == set(TWO)
    # The same samples, judged from the start as before: both ranks named "the slowest", one after the other.
    bare = Job(pace.Pace(TWO))
    bare.rule.see = lambda name, seen, now: bare.rule.cpu(name, *seen.cpu, now)
    bare.run(90, COMPILE_0).run(90, COMPILE_1).run(300, EVEN)
    assert [found.task for _, found in bare.named] == ["worker:0", "worker:1"]


def test_a_compile_with_the_compilers_coming_and_going_is_no_start():
    # Both ranks busy but one only in compiler processes that end (each end drops its time).
    job = Job(Training(TWO)).run(120, {"worker:0": 1.0, "worker:1": 0.3}, drops={"worker:0"})
    assert job.rule.began is None and job.named == []


def test_a_slow_task_after_the_start_up_is_named_within_a_window_of_training():
    job = Job(Training(TWO)).run(90, COMPILE_0)
    job.run(300, {"worker:0": 0.4, "worker:1": 1.0})
    [(at, found)] = job.named
    assert found.task == "worker:1" and 90 + pace.WINDOW * pace.MIN_COVER <= at
    assert at <= 90 + pace.WINDOW + (pace.STEADY_SAMPLES + 2) * pace.SAMPLE_INTERVAL
    # One other task: one share for the others in run.json.
    assert found.to_dict()["others"] == [0.4] and "the others 40%" in found.text()


def test_tasks_not_ready_are_not_judged():
    job = Job(Training(TWO)).run(300, {"worker:0": 0.4, "worker:1": 1.0}, ready=False)
    assert job.named == [] and job.rule.began is None
    job.run(300, {"worker:0": 0.4, "worker:1": 1.0})
    assert [found.task for _, found in job.named] == ["worker:1"]


def test_progress_begins_training_where_samples_cannot():
    # worker:1 is thirty times slower: worker:0 waits nearly all the time, below AT_WORK.
    slow = {"worker:0": 0.03, "worker:1": 1.0}
    assert Job(Training(TWO)).run(300, slow).named == []
    job = Job(Training(TWO)).run(300, slow, progressed=True)
    assert [found.task for _, found in job.named] == ["worker:1"]


def test_a_time_split_is_training_even_without_the_ready_sign():
    # Tasks that never join where mgpu can see, but print their split (e.g. a Slurm step).
    rule = Training(TWO)
    named = None
    for step in range(1, 200):
        now = step * pace.SAMPLE_INTERVAL
        rule.see("worker:0", Seen(False, split=(700 * step, 1300 * step)), now)
        rule.see("worker:1", Seen(False, split=(1900 * step, 100 * step)), now)
        named = named or rule.slowest(now)
    assert named is not None and named.task == "worker:1" and named.source == pace.SPLIT


def test_each_task_is_still_named_once_a_run_and_others_keep_their_range():
    hosts = {"worker:0": "h1", "worker:1": "h2", "worker:2": "h3"}
    named: set[str] = set()
    slow = {"worker:0": 0.45, "worker:1": 1.0, "worker:2": 0.41}
    [(_, found)] = Job(Training(hosts, named=named), hosts).run(300, slow).named
    assert found.to_dict()["others"] == [0.41, 0.45]
    assert Job(Training(hosts, named=named), hosts).run(300, slow).named == []
