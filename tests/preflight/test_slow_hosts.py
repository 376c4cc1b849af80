"""Which hosts the speed probe's figures name as slow: a pure judgement, no probe runs here."""

import pytest

from launcher.host.probe import probe_source, speed_probe
from launcher.preflight.speed import HostSpeed, SlowFigure, describe, slow_hosts, warning_lines


def test_a_host_far_below_the_median_is_named_with_its_figure_and_the_median():
    speeds = [HostSpeed("h1", cpu_gflops=10.0), HostSpeed("h2", cpu_gflops=2.0), HostSpeed("h3", cpu_gflops=11.0)]
    assert slow_hosts(speeds) == [SlowFigure("h2", "compute", 2.0, 10.0, "GFLOP/s")]
    assert warning_lines(slow_hosts(speeds)) == [
        "h2 is slow: compute 2.0 GFLOP/s (median 10.0); in synchronous training every task waits for it"]


def test_hosts_within_the_margin_are_not_named():
    # 0.7 of the median is the line: 7.1 of a median of 10 is above it, and so is every host of an even pair.
    assert slow_hosts([HostSpeed("h1", cpu_gflops=10.0), HostSpeed("h2", cpu_gflops=7.1),
                       HostSpeed("h3", cpu_gflops=12.0)]) == []
    assert slow_hosts([HostSpeed("h1", cpu_gflops=10.0), HostSpeed("h2", cpu_gflops=6.0)]) == []


def test_of_two_hosts_one_far_slower_is_named():
    # With two hosts the median is their mean: one under 0.7 of it is less than 0.54 of the other.
    assert [slow.host for slow in slow_hosts([HostSpeed("h1", cpu_gflops=2.0), HostSpeed("h2", cpu_gflops=9.0)])] == ["h1"]


def test_one_host_or_unknown_figures_name_no_one():
    assert slow_hosts([HostSpeed("h1", cpu_gflops=1.0)]) == []
    assert slow_hosts([HostSpeed("h1", cpu_gflops=1.0), HostSpeed("h2"), HostSpeed("h3")]) == []
    # A host without numpy has no compute figure: the others are judged among themselves.
    assert [s.host for s in slow_hosts([HostSpeed("h1", cpu_gflops=1.0), HostSpeed("h2"),
                                        HostSpeed("h3", cpu_gflops=9.0), HostSpeed("h4", cpu_gflops=10.0)])] == ["h1"]


def test_each_figure_is_judged_on_its_own():
    speeds = [HostSpeed("h1", cpu_gflops=10.0, gpu_gflops=100.0), HostSpeed("h2", cpu_gflops=10.0, gpu_gflops=20.0),
              HostSpeed("h3", cpu_gflops=3.0, gpu_gflops=100.0)]
    assert [(slow.host, slow.figure) for slow in slow_hosts(speeds)] == [("h2", "GPU"), ("h3", "compute")]


def ring(sends):
    """HostSpeeds of a ring: host i sent sends[i] MB/s to host i+1."""
    return [HostSpeed(f"h{i}", send_mbps=sent, receive_mbps=sends[i - 1]) for i, sent in enumerate(sends)]


def test_the_host_both_of_whose_links_are_slow_is_named_not_its_neighbours():
    # h2 is slow: the link h1 -> h2 and the link h2 -> h3 both are; h1 and h3 each have a good one too.
    speeds = ring([900.0, 100.0, 110.0, 940.0, 920.0])  # h1 -> h2 and h2 -> h3 are slow
    assert [(s.host, s.network_mbps) for s in speeds] == [("h0", 920.0), ("h1", 900.0), ("h2", 110.0),
                                                          ("h3", 940.0), ("h4", 940.0)]
    named = slow_hosts(speeds)
    assert [(slow.host, slow.figure, slow.value, slow.median) for slow in named] == [("h2", "network", 110.0, 920.0)]


def test_of_two_hosts_the_network_names_neither():
    # Both links join the same two hosts: a slow one cannot be told from the other.
    assert slow_hosts(ring([100.0, 900.0])) == []


def test_the_table_shows_the_figures_that_were_measured():
    assert describe(HostSpeed("h1", cpu_gflops=9.25, send_mbps=851.3, receive_mbps=12.0)) == \
        "cpu 9.2 GFLOP/s, net 851 MB/s"
    assert describe(HostSpeed("h1", cpu_gflops=0.04, gpu_gflops=45678.0)) == "cpu 0.04 GFLOP/s, gpu 45678 GFLOP/s"
    assert describe(HostSpeed("h1", problems=("no numpy",))) == "-"


def test_the_best_window_is_the_rate():
    # A clock moved by hand: each step takes 0.1 s in the first window and 0.05 s in the others.
    now = [0.0]
    costs = iter([0.1] * 3 + [0.05] * 100)

    def step():
        now[0] += next(costs)

    rate = speed_probe.best_rate(step, 10.0, window=0.25, windows=2, clock=lambda: now[0])
    assert rate == pytest.approx(200.0)  # 5 steps of 10 units in 0.25 s; the first window did 3 in 0.3 s


def test_the_probe_imports_only_the_standard_library_at_its_top():
    # It runs with whatever Python a host has: numpy, torch and TensorFlow only inside the functions that time them.
    import ast
    import sys

    tree = ast.parse(probe_source())  # as it is shipped
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert top <= set(sys.stdlib_module_names), top - set(sys.stdlib_module_names)
    inside = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {"numpy", "torch", "tensorflow"} <= inside  # the figures' imports are there, guarded
