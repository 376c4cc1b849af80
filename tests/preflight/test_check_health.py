"""`mgpu check --health-check`: the launch's health check on every host, in the table (HEALTH) and
in --json; a host that fails it fails the check, named with the check's last lines, and
--health-check-timeout is its time."""

import json

from launching import free_port, run_mgpu


def test_mgpu_check_runs_the_health_check_and_fails_a_host_that_fails_it(tmp_path):
    workers = f"127.0.0.1:{free_port()}"
    failed = run_mgpu("check", "--workers", workers, "--json", "--health-check",
                      "echo started; echo 'disk /data: missing' >&2; exit 3", "--", "true", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    (row,) = json.loads(failed.stdout)["hosts"]
    why = "the health check exited with code 3: disk /data: missing"
    assert (row["health"], row["ok"], row["problems"]) == ("failed", False, [why]), row
    assert failed.stderr.splitlines()[-1] == f"mgpu: error: check failed on 127.0.0.1: {why}", failed.stderr

    late = run_mgpu("check", "--workers", workers, "--health-check", "sleep 5", "--health-check-timeout", "0.5",
                    "--", "true", cwd=tmp_path)
    assert late.returncode == 1, late.stderr
    assert late.stderr.splitlines()[-1].endswith(": the health check did not finish within 0.5 s"), late.stderr

    passed = run_mgpu("check", "--workers", workers, "--health-check", "test -d .", "--", "true", cwd=tmp_path)
    assert passed.returncode == 0, passed.stderr
    header, row = passed.stdout.splitlines()[:2]
    assert row[header.index(" HEALTH ") + 1:].split()[0] == "ok" and row.endswith("  ok"), passed.stdout
