"""The host checks' table as JSON (preflight/check_json.py), as `mgpu check --json` prints it and a
launch keeps it in checks.json: the rows with their speed figures, the slow hosts named, and a table
too large for its reader cut to whole rows that fit. Pure."""

import json

from launcher.preflight.host_report import HostReport
from launcher.preflight.check_json import bounded, document
from launcher.preflight.speed import HostSpeed
from launcher.supervise.rundir import MAX_CHECKS_BYTES


def reports(n, problem=""):
    return [HostReport(f"h{i}", (f"worker:{i}",), ssh="ok", python="3.11.7", problems=[problem] if problem else [])
            for i in range(n)]


def test_the_rows_carry_their_speed_and_the_slow_host_is_named():
    speeds = [HostSpeed("h0", cpu_gflops=10.0), HostSpeed("h1", cpu_gflops=10.5), HostSpeed("h2", cpu_gflops=1.0)]
    doc = document(reports(3), speeds, ["worker:0 cannot reach worker:2"])
    assert [row["host"] for row in doc["hosts"]] == ["h0", "h1", "h2"]
    assert doc["slow_hosts"] == ["h2"] and doc["unreachable"] == ["worker:0 cannot reach worker:2"]
    assert doc["hosts"][2]["speed"]["cpu_gflops"] == 1.0 and doc["hosts"][2]["speed"]["slow"][0]["figure"] == "compute"
    assert doc["hosts"][0]["speed"]["slow"] == [] and doc["hosts"][0]["tasks"] == ["worker:0"]
    assert json.loads(bounded(doc)) == doc  # a table that fits is kept whole


def test_a_table_too_large_for_its_reader_keeps_the_rows_that_fit_and_says_how_many_did_not():
    doc = document(reports(3000, "x" * 1000), [], ["y" * 1000] * 3000)
    text = bounded(doc)
    assert len(text.encode()) <= MAX_CHECKS_BYTES
    cut = json.loads(text)
    kept = len(cut["hosts"])
    assert 0 < kept < 3000 and cut["hosts_left_out"] == 3000 - kept
    assert [row["host"] for row in cut["hosts"]] == [f"h{i}" for i in range(kept)]
