"""Two hosts lost at once: h1 and h2 die together (their links go down, every process in their
namespaces is killed): both are judged lost after the attempt and left out in one step, each taking
a spare of its own; with one spare only, the run stops and its relaunch command names neither."""

from __future__ import annotations

import shlex

import pytest

from lost_hosts import five_hosts, run_losing  # noqa: F401 - a fixture

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(300)]


def test_two_hosts_lost_at_once_are_left_out_together_each_for_a_spare(five_hosts, tmp_path):
    code, out, record = run_losing(five_hosts, tmp_path, "h4,h5", ("h1", "h2"))
    assert code == 0, out[-4000:]
    first, second = record["attempts"]
    judged = {(first["task"], first["host"], first["cause"])} | {(c["task"], c["host"], c["cause"]) for c in first["also"]}
    assert judged == {("worker:0", "h1", "host-lost"), ("worker:1", "h2", "host-lost")}, first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {
        "worker:0": "h4", "worker:1": "h5", "worker:2": "h3"}
    assert sorted((c["host"], c["cause"], c["replaced_by"]) for c in record["costs"]["left_out"]) == [
        ("h1", "host-lost", "h4 took worker:0"), ("h2", "host-lost", "h5 took worker:1")]
    assert "restarting all tasks without h1, h2 (restart 1 of 2)" in out or \
        "restarting all tasks without h2, h1 (restart 1 of 2)" in out, out[-4000:]
    assert "failed its checks" not in out, out[-4000:]


def test_without_a_spare_for_each_the_relaunch_command_names_no_lost_host(five_hosts, tmp_path):
    code, out, record = run_losing(five_hosts, tmp_path, "h4", ("h1", "h2"))
    assert code == 1, out[-4000:]
    report = out[out.index("mgpu: error: "):].splitlines()
    assert report[0].startswith("mgpu: error: h") and " and no spare host to take worker:0, worker:1; " \
        "relaunch without them:" in report[0], report
    assert "h1 left out (host-lost: " in report[0] and "h2 left out (host-lost: " in report[0], report
    relaunch = report[1]
    assert relaunch.startswith("  mgpu launch --workers h3:2222 --spare-hosts h4 --max-restarts 2 "), report
    # No host list of the command names a lost host (paths may hold "h2" by chance: fresh2/, ...).
    words = shlex.split(relaunch.split(" -- ")[0])  # the options, before the program
    host_lists = [words[i + 1] for i, word in enumerate(words[:-1]) if word in ("--workers", "--spare-hosts")]
    assert host_lists == ["h3:2222", "h4"], relaunch
    assert "failed its checks" not in out, out[-4000:]  # the spare was never charged
    assert [a["cause"] for a in record["attempts"]] == ["host-lost"]
