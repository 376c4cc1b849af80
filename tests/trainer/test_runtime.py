"""Runtime set-up that needs TensorFlow but no GPU: threads, collectives, device checks."""

import pytest
from needs import installed_version

from launcher.errors import UsageError
from launcher.trainer import options

pytestmark = pytest.mark.slow
installed_version("tensorflow", "the train extra")


def test_nccl_without_gpus_is_a_usage_error():
    from launcher.trainer import strategy
    opts = options.parse(["--all-reduce", "nccl"])
    with pytest.raises(UsageError, match="--all-reduce nccl needs GPUs"):
        strategy.communication_options(opts, num_gpus=0)


def test_communication_options_carry_the_tuning_flags():
    import tensorflow as tf
    from launcher.trainer import strategy
    opts = options.parse(["--all-reduce", "ring", "--bytes-per-pack", "4096",
                          "--collective-timeout", "30"])
    comm = strategy.communication_options(opts, num_gpus=0)
    assert comm.bytes_per_pack == 4096 and comm.timeout_seconds == 30
    assert comm.implementation == tf.distribute.experimental.CommunicationImplementation.RING


def test_threads_flag_wins_over_the_launchers_env_vars():
    from launcher.trainer import strategy
    env = {"TF_NUM_INTRAOP_THREADS": "3", "TF_NUM_INTEROP_THREADS": "2"}
    assert strategy.thread_counts(None, env) == (3, 2)
    assert strategy.thread_counts(4, env) == (4, 4)
    assert strategy.thread_counts(None, {}) == (0, 0)
    with pytest.raises(UsageError, match="TF_NUM_INTRAOP_THREADS must be an integer"):
        strategy.thread_counts(None, {"TF_NUM_INTRAOP_THREADS": "many"})
    with pytest.raises(UsageError, match="TF_NUM_INTEROP_THREADS must be an integer"):
        strategy.thread_counts(None, {"TF_NUM_INTEROP_THREADS": "\u0663"})  # int() would read 3
