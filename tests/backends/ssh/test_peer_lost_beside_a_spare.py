"""A peer that dies while a spare is being made ready is the peer's fault: the spare is kept, and
the peer is left out too, taking the next spare."""

from __future__ import annotations

import pytest

from lost_hosts import five_hosts, run_losing  # noqa: F401 - a fixture

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(300)]


def test_a_peer_lost_while_a_spare_is_made_ready_is_the_peers_fault(five_hosts, tmp_path):
    code, out, record = run_losing(five_hosts, tmp_path, "h4,h5", ("h1",), during_spare_setup="h2")
    assert code == 0, out[-4000:]
    first, second = record["attempts"]
    assert (first["cause"], first["task"], first["host"]) == ("host-lost", "worker:0", "h1"), first
    assert "also" not in first, first  # h2 was well when the attempt was judged
    assert "h2 is gone too: the spares' check cannot log in to it; it is left out, not the spares" in out, out[-4000:]
    assert "spare host h4 failed its checks" not in out, out[-4000:]
    assert {name: task["host"] for name, task in second["tasks"].items()} == {
        "worker:0": "h4", "worker:1": "h5", "worker:2": "h3"}
    assert sorted((c["host"], c["replaced_by"]) for c in record["costs"]["left_out"]) == [
        ("h1", "h4 took worker:0"), ("h2", "h5 took worker:1")]
