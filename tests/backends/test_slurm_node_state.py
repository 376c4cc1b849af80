"""A node gone under Slurm, as Slurm's controller says it: the words of its state read from
scontrol's untrusted line; a node down or not responding is gone, any other state is up (pure)."""

from launcher.backends.slurm_node import node_state, node_up

DOWN = ("NodeName=h2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 CPUTot=4 NodeAddr=10.1.0.3 "
        "State=DOWN+NOT_RESPONDING ThreadsPerCore=1 Reason=Not responding [slurm@2026-11-28T19:35:58]")


def test_a_node_down_or_not_responding_is_gone_and_any_other_state_is_up():
    assert node_state(DOWN) == ("DOWN", "NOT_RESPONDING") and node_up(DOWN) is False
    assert node_up("NodeName=h2 State=ALLOCATED+NOT_RESPONDING Partitions=test") is False  # before it is marked down
    assert node_up("NodeName=h2 State=FAIL Partitions=test") is False
    assert node_up("NodeName=h1 State=ALLOCATED Partitions=test") is True
    assert node_up("NodeName=h1 State=MIXED+DRAIN Partitions=test") is True  # draining: its running tasks go on


def test_only_the_state_field_is_read_and_within_bounds():
    assert node_up("NodeName=h1 Reason=State=DOWN") is None  # a word inside another field is not the state
    assert node_up("NodeName=h1 State=down;rm Reason=x") is None  # not a state's words
    assert node_up("") is None and node_up("State=" + "D" * 10_000) is None
    assert node_up("x" * 70_000 + " State=DOWN") is None  # past the bound of an answer
