"""The global batch of a run resumed on another number of workers than planned (MGPU_WORLD_SIZE_MAX):
pure, no TensorFlow."""

import pytest

from launcher.errors import UsageError
from launcher.trainer import cluster, options
from launcher.trainer.planned_size import ENV_WORLD_SIZE_MAX, choose_global_batch, planned_workers


def choice(argv, replicas, workers, planned):
    return choose_global_batch(options.parse(argv), replicas, workers, planned)


@pytest.mark.parametrize("argv, replicas, expected", [
    (["--batch-size-per-replica", "32"], 2, 64), ([], 3, 384), (["--global-batch-size", "90"], 3, 90)])
def test_without_a_planned_size_the_batch_is_todays(argv, replicas, expected):
    for planned in (None, replicas):  # unset, or running at the planned size
        picked = choice(argv, replicas, replicas, planned)
        assert (picked.size, picked.note) == (expected, None)


def test_at_the_planned_size_a_global_batch_that_does_not_divide_is_still_a_usage_error():
    with pytest.raises(UsageError, match="does not divide among 2 replicas; use 44$"):
        choice(["--global-batch-size", "45"], 2, 2, 2)


def test_on_fewer_workers_the_planned_global_batch_is_kept_where_it_divides():
    picked = choice(["--batch-size-per-replica", "32"], 2, 2, 3)
    assert picked.size == 96
    assert picked.note == "on 2 of the 3 planned workers: global batch 96 as planned, 48 per replica"
    # The default per-replica batch, planned for 4 workers, on 2.
    assert choice([], 2, 2, 4).size == 512
    # Workers of 2 GPUs each: 3 planned are 6 replicas of 10, kept on the 4 replicas of 2 workers.
    picked = choice(["--batch-size-per-replica", "10"], 4, 2, 3)
    assert (picked.size, picked.note) == (60, "on 2 of the 3 planned workers: global batch 60 as planned, 15 per replica")


def test_a_planned_global_batch_that_does_not_divide_is_replaced_by_the_nearest_that_does_and_said():
    picked = choice(["--global-batch-size", "45"], 2, 2, 3)
    assert picked.size == 44
    assert picked.note == ("on 2 of the 3 planned workers: the planned global batch 45 does not divide among 2 "
                           "replicas; global batch 44, 22 per replica")
    assert choice(["--global-batch-size", "47"], 2, 2, 3).size == 46  # of two as near, the smaller
    assert choice(["--global-batch-size", "47"], 3, 3, 4).size == 48  # the nearer one, above
    assert choice(["--global-batch-size", "2"], 3, 3, 4).size == 3  # never 0


def test_on_more_workers_than_planned_the_planned_global_batch_is_kept_where_it_divides():
    picked = choice(["--batch-size-per-replica", "16"], 4, 4, 2)
    assert (picked.size, picked.note) == (32, "on 4 workers, 2 planned: global batch 32 as planned, 8 per replica")
    assert choice(["--global-batch-size", "30"], 4, 4, 2).size == 28


@pytest.mark.parametrize("raw, expected", [(None, None), ("", None), ("  ", None), ("3", 3), (" 12\n", 12)])
def test_the_planned_size_is_read_from_the_environment(raw, expected):
    environ = {} if raw is None else {ENV_WORLD_SIZE_MAX: raw}
    assert planned_workers(environ) == expected
    assert cluster.resolve(None, None, environ).planned_workers == expected


@pytest.mark.parametrize("raw", ["0", "-1", "3.0", "three", "\u0663", str(2**20 + 1), "9" * 5000, "2 3"])
def test_a_planned_size_that_is_not_a_worker_count_is_a_usage_error_in_one_short_line(raw):
    with pytest.raises(UsageError) as refused:
        planned_workers({ENV_WORLD_SIZE_MAX: raw})
    message = str(refused.value)
    assert message.startswith(f"{ENV_WORLD_SIZE_MAX} must be a number of workers from 1 to 1048576, not ")
    assert "\n" not in message and len(message) < 160
