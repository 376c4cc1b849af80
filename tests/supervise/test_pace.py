"""The rule that names the task a synchronous job waits for (supervise/pace.py), with a clock moved
by hand: busy shares from CPU samples and from the tasks' own time splits."""

from launcher.supervise import pace
from launcher.supervise.pace import Pace

HOSTS = {"worker:0": "h1", "worker:1": "h2", "worker:2": "h3"}


def feed_cpu(rule: Pace, shares: dict[str, float], start: float, seconds: float, step: float = 2.0) -> float:
    """Samples every `step` s from `start` for `seconds`: each task runnable for its share of the time."""
    now = start
    runnable = {name: getattr(rule, "_fed", {}).get(name, 0.0) for name in shares}
    while now < start + seconds:
        now += step
        for name, share in shares.items():
            runnable[name] += share * step
            rule.cpu(name, now, runnable[name], now)
    rule._fed = runnable
    return now


def first_named(rule: Pace, shares: dict[str, float], start: float, until: float) -> tuple[float, pace.Slowest] | None:
    now = start
    while now < until:
        now = feed_cpu(rule, shares, now, pace.SAMPLE_INTERVAL)
        found = rule.slowest(now)
        if found is not None:
            return now, found
    return None


def test_the_slow_task_is_named_once_within_the_window_and_a_bit():
    rule = Pace(HOSTS)
    found = first_named(rule, {"worker:0": 0.45, "worker:1": 0.96, "worker:2": 0.41}, 0.0, 600.0)
    assert found is not None
    at, slowest = found
    assert pace.WINDOW * pace.MIN_COVER <= at <= pace.WINDOW + 2 * pace.SAMPLE_INTERVAL
    assert slowest.task == "worker:1" and slowest.host == "h2" and slowest.source == pace.CPU
    assert slowest.text() == ("worker:1 on h2 is the slowest: busy 96% of the last 60 s, the others 41-45%: "
                              "they wait for it (CPU samples)")
    assert first_named(rule, {"worker:0": 0.45, "worker:1": 0.96, "worker:2": 0.41}, at, at + 600.0) is None


def test_an_even_cluster_is_never_named():
    rule = Pace(HOSTS)
    assert first_named(rule, {"worker:0": 0.62, "worker:1": 0.71, "worker:2": 0.55}, 0.0, 900.0) is None
    source, shares = rule.shares(900.0)
    assert source == pace.CPU and round(shares["worker:1"], 2) == 0.71


def test_busy_but_not_by_enough_points_or_ratio():
    # 1.3x but only 12 points above: a lightly loaded job where nobody waits much.
    assert first_named(Pace(HOSTS), {"worker:0": 0.40, "worker:1": 0.52, "worker:2": 0.40}, 0.0, 600.0) is None
    # 22 points above but only 1.29x: everybody is busy.
    assert first_named(Pace(HOSTS), {"worker:0": 0.80, "worker:1": 1.0, "worker:2": 0.75}, 0.0, 600.0) is None


def test_an_imbalance_that_starts_late_is_named_within_a_window_of_its_start():
    rule = Pace(HOSTS)
    even = {"worker:0": 0.9, "worker:1": 0.9, "worker:2": 0.9}
    now = feed_cpu(rule, even, 0.0, 300.0)
    assert rule.slowest(now) is None
    found = first_named(rule, {"worker:0": 0.4, "worker:1": 1.0, "worker:2": 0.4}, now, now + 600.0)
    assert found is not None and found[1].task == "worker:1"
    assert found[0] - now <= pace.WINDOW


def test_not_before_every_task_has_samples_covering_the_window():
    rule = Pace(HOSTS)
    now = feed_cpu(rule, {"worker:0": 0.4, "worker:1": 1.0}, 0.0, 300.0)  # worker:2 unmeasured
    assert rule.slowest(now) is None
    assert set(rule.shares(now)[1]) == {"worker:0", "worker:1"}


def test_shares_are_capped_at_one_and_a_drop_counts_as_nothing():
    rule = Pace({"worker:0": "h1", "worker:1": "h2"})
    rule.cpu("worker:0", 0.0, 0.0, 0.0)
    rule.cpu("worker:0", 2.0, 7.0, 2.0)  # four threads busy: 350 % of a core
    rule.cpu("worker:0", 4.0, 3.0, 4.0)  # a process ended and took its time with it
    rule.cpu("worker:0", 4.0, 3.5, 4.5)  # the sampler's clock did not move: no interval
    assert rule.shares(4.5) == (pace.CPU, {"worker:0": 0.5})


def test_the_tasks_own_time_split_is_taken_over_cpu_samples():
    rule = Pace({"worker:0": "h1", "worker:1": "h2"})
    # CPU says both busy (NCCL spinning while it waits); the split says worker:1 computes, worker:0 waits.
    compute = {"worker:0": 0, "worker:1": 0}
    wait = {"worker:0": 0, "worker:1": 0}
    now = 0.0
    found = None
    while now < 300 and found is None:
        now += 2.0
        for name in HOSTS:
            if name in compute:
                rule.cpu(name, now, now, now)
        compute["worker:0"] += 700
        wait["worker:0"] += 1300
        compute["worker:1"] += 1900
        wait["worker:1"] += 100
        for name in compute:
            rule.split(name, compute[name], wait[name], now)
        found = rule.slowest(now)
    assert found is not None and found.task == "worker:1" and found.source == pace.SPLIT
    assert "(its own time split)" in found.text() and "busy 95%" in found.text()


def test_cpu_samples_where_a_task_prints_no_split():
    rule = Pace({"worker:0": "h1", "worker:1": "h2"})
    rule.split("worker:0", 1000, 1000, 1.0)
    rule.split("worker:0", 3000, 1000, 2.0)
    feed_cpu(rule, {"worker:0": 0.5, "worker:1": 0.5}, 0.0, 10.0)
    assert rule.shares(10.0)[0] == pace.CPU


def test_each_task_named_once_in_a_run_across_attempts():
    named: set[str] = set()
    slow = {"worker:0": 0.4, "worker:1": 1.0, "worker:2": 0.4}
    assert first_named(Pace(HOSTS, named=named), slow, 0.0, 600.0) is not None
    assert first_named(Pace(HOSTS, named=named), slow, 0.0, 600.0) is None
    found = first_named(Pace(HOSTS, named=named), {"worker:0": 1.0, "worker:1": 0.4, "worker:2": 0.4}, 0.0, 600.0)
    assert found is not None and found[1].task == "worker:0"


def test_parameter_server_training_and_sidecars_are_not_compared():
    tasks = [("chief:0", "chief", "h1"), ("worker:0", "worker", "h2"), ("evaluator:0", "evaluator", "h3")]
    assert pace.compared(tasks, frozenset({"evaluator"}), frozenset()) == {"chief:0": "h1", "worker:0": "h2"}
    assert pace.compared(tasks, frozenset({"evaluator"}), frozenset({"worker", "ps"})) == {}
