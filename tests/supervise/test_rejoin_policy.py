"""Taking back a host the run went on without (--min-hosts, --rejoin-interval): the pure rule
(rejoin.py) on a clock moved by hand, and the checkpoint line it waits for."""

from launcher import protocol
from launcher.supervise.rejoin import Rejoin


def test_a_host_left_out_is_probed_every_interval_until_it_passes():
    rule = Rejoin(interval=300.0)
    rule.left_out(["h2"], now=1000.0)
    assert rule.due(1299.0) == () and rule.next_probe_at() == 1300.0
    assert rule.due(1300.0) == ("h2",)
    assert rule.due(1400.0) == ()  # being probed: never two probes of a host at once
    assert rule.probed("h2", False, now=1310.0) is False and rule.back == []
    assert rule.due(1609.0) == () and rule.due(1610.0) == ("h2",)
    assert rule.probed("h2", True, now=1620.0) is True and rule.back == ["h2"]
    assert rule.due(99999.0) == ()  # back: no more probes


def test_a_host_back_is_taken_back_right_after_a_checkpoint_at_most_once_per_interval():
    rule = Rejoin(interval=300.0)
    rule.left_out(["h2", "h3"], now=0.0)
    assert rule.due(300.0) == ("h2", "h3")
    rule.probed("h2", True, 301.0)
    assert rule.grow_now(checkpoints_since=0, now=302.0) is False  # no checkpoint yet: it waits for one
    assert rule.grow_now(checkpoints_since=1, now=303.0) is True
    rule.taken_back(["h2"], now=303.0)
    rule.probed("h3", True, 310.0)
    assert rule.grow_now(1, 500.0) is False  # within an interval of the last growth
    assert rule.grow_now(1, 603.0) is True


def test_a_host_taken_back_that_is_left_out_again_stays_out():
    rule = Rejoin(interval=10.0)
    rule.left_out(["h2"], 0.0)
    rule.due(10.0)
    rule.probed("h2", True, 11.0)
    rule.taken_back(["h2"], 12.0)
    rule.left_out(["h2"], 20.0)
    assert rule.forgotten("h2") and rule.due(1e9) == () and rule.back == []


def test_interval_zero_never_probes():
    rule = Rejoin(interval=0.0)
    rule.left_out(["h2"], 0.0)
    assert rule.due(1e9) == () and not rule.grow_now(5, 1e9)


def test_the_checkpoint_line():
    assert protocol.parse_checkpoint(protocol.checkpoint_line(12)) == 12
    assert protocol.parse_checkpoint("MGPU_CHECKPOINT 12\r\n") == 12
    for line in ("MGPU_CHECKPOINT", "MGPU_CHECKPOINT -1", "MGPU_CHECKPOINT ²", "MGPU_CHECKPOINT 1 2",
                 "MGPU_CHECKPOINT " + "9" * 19, "xMGPU_CHECKPOINT 1"):
        assert protocol.parse_checkpoint(line) is None, line
