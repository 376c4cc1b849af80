"""The quarantine on the command line: `mgpu hosts` lists and lifts it; launch and check warn about
a quarantined host and give its tasks to a spare where one is given; --quarantine 0 ignores it."""

import json
import os
import time

from launcher.config.quarantine import entries_for
from launcher.host.quarantine_file import FILE_NAME, QuarantineFile


def quarantine(*hosts: str, detail: str = "SSH keepalives unanswered; a fresh login fails") -> QuarantineFile:
    keeper = QuarantineFile()  # in this test's XDG_STATE_HOME (conftest)
    # As a run writes them: what a host or a program said is made one printable line.
    assert keeper.add(entries_for({host: f"host-lost: {detail}" for host in hosts}, "run-7", time.time(), 3600))
    return keeper


def test_hosts_lists_the_quarantine_and_clear_lifts_it(mgpu):
    empty = mgpu("hosts")
    assert empty.exit_code == 0 and empty.stdout.startswith("no quarantined hosts (")
    keeper = quarantine("h2", "h3", detail="tasks said \x1b]0;title\x07 bye")
    listed = mgpu("hosts")
    assert listed.exit_code == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["HOST", "CAUSE", "UNTIL", "RUN", "DETAIL"]
    assert [row.split()[:2] + row.split()[4:5] for row in rows] == [["h2", "host-lost", "run-7"],
                                                                    ["h3", "host-lost", "run-7"]]
    assert "\x1b" not in listed.stdout and rows[0].endswith("tasks said ?]0;title? bye")
    as_json = json.loads(mgpu("hosts", "--json").stdout)
    assert as_json["file"] == keeper.path and [h["host"] for h in as_json["hosts"]] == ["h2", "h3"]
    cleared = mgpu("hosts", "--clear", "h2", "--clear", "h9")
    assert cleared.exit_code == 0
    assert cleared.stderr.splitlines() == ["mgpu: h2: quarantine lifted", "mgpu: h9: was not quarantined"]
    assert [e.host for e in keeper.entries()] == ["h3"]


def test_a_bad_file_is_one_warning_and_set_aside(mgpu):
    keeper = QuarantineFile()
    os.makedirs(keeper.folder)
    with open(keeper.path, "w") as file:
        file.write("not json at all")
    listed = mgpu("hosts")
    assert listed.exit_code == 0 and listed.stdout.startswith("no quarantined hosts")
    (warning,) = listed.stderr.splitlines()
    assert warning.startswith(f"mgpu: warning: the quarantine file {keeper.path} is unreadable (not JSON (")
    assert [name for name in os.listdir(keeper.folder) if name.startswith(f"{FILE_NAME}.bad-")]
    assert mgpu("hosts").stderr == ""


def test_launch_gives_a_quarantined_hosts_tasks_to_a_spare(mgpu):
    quarantine("h2", "h5")
    done = mgpu("launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h5,h6", "--dry-run", "--json")
    assert done.exit_code == 0, done.stderr
    assert [task["host"] for task in done.json()["tasks"]] == ["h1", "h6"]
    warnings = done.stderr.splitlines()
    assert warnings[0].startswith("mgpu: warning: spare host h5 is quarantined (host-lost in run run-7: ")
    assert warnings[1].startswith("mgpu: warning: h2 is quarantined (host-lost in run run-7: SSH keepalives ")
    assert warnings[1].endswith("): spare host h6 takes its tasks") and len(warnings) == 2


def test_without_a_spare_or_with_quarantine_0_the_host_runs_its_tasks(mgpu):
    quarantine("h2")
    done = mgpu("launch", "--workers", "h1:2222,h2:2222", "--dry-run", "--json")
    assert [task["host"] for task in done.json()["tasks"]] == ["h1", "h2"]
    assert done.stderr.endswith("; no spare host takes its place, so it runs its tasks "
                                "(`mgpu hosts --clear h2` lifts the quarantine)\n")
    off = mgpu("launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h5", "--quarantine", "0", "--dry-run", "--json")
    assert [task["host"] for task in off.json()["tasks"]] == ["h1", "h2"] and off.stderr == ""
    bad = mgpu("launch", "--workers", "h1:2222", "--quarantine", "1w", "--dry-run")
    assert bad.exit_code == 2 and "'1w' is not a duration" in bad.stderr


def test_check_warns_and_checks_the_spare_in_its_place(mgpu):
    quarantine("h2")
    done = mgpu("check", "--workers", "h2:2222", "--spare-hosts", "127.0.0.1", "--json", "--", "true")
    assert done.stderr.startswith("mgpu: warning: h2 is quarantined (host-lost in run run-7: ")
    assert "spare host 127.0.0.1 takes its tasks" in done.stderr.splitlines()[0]
    assert [row["host"] for row in done.json()["hosts"]] == ["127.0.0.1"], done.stdout


def test_the_specs_quarantine_sets_its_duration_and_the_command_line_wins(mgpu, tmp_path):
    quarantine("h2")
    spec = tmp_path / "spec.yaml"
    spec.write_text('cluster:\n  worker: ["h1:2222", "h2:2222"]\nspares: [h5]\nquarantine: 0\n')
    off = mgpu("launch", "--spec", str(spec), "--dry-run", "--json")
    assert [task["host"] for task in off.json()["tasks"]] == ["h1", "h2"] and off.stderr == "", off.stderr
    spec.write_text('cluster:\n  worker: ["h1:2222", "h2:2222"]\nspares: [h5]\nquarantine: 2d\n')
    on = mgpu("launch", "--spec", str(spec), "--dry-run", "--json")
    assert [task["host"] for task in on.json()["tasks"]] == ["h1", "h5"], on.stderr
    wins = mgpu("launch", "--spec", str(spec), "--quarantine", "0", "--dry-run", "--json")
    assert [task["host"] for task in wins.json()["tasks"]] == ["h1", "h2"], wins.stderr
    spec.write_text('cluster:\n  worker: ["h1:2222"]\nquarantine: 1w\n')
    bad = mgpu("launch", "--spec", str(spec), "--dry-run")
    assert bad.exit_code == 2 and "quarantine: '1w' is not a duration" in bad.stderr, bad.stderr
