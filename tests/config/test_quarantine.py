"""The quarantine as data: what a document must be to be read, how entries are added, lifted and
expire, and what a new run makes of a quarantined host (a spare in its place, or a warning)."""

import json

import pytest

from launcher.config import quarantine
from launcher.config.quarantine import Entry
from launcher.config.spec import ClusterSpec, TaskSpec

DAY = 86400.0


def entry(host, since=1000.0, until=1000.0 + DAY, cause="host-lost"):
    return Entry(host, cause, "SSH keepalives unanswered; a fresh login fails", "run-1", since, until)


def document(*hosts) -> dict:
    return {"version": 1, "hosts": [e.to_dict() if isinstance(e, Entry) else e for e in hosts]}


def test_a_document_mgpu_wrote_reads_back():
    entries = (entry("h2"), entry("10.0.0.7", cause="network"))
    assert quarantine.parse(quarantine.render(entries)) == entries


@pytest.mark.parametrize("text, why", [
    ("x" * (quarantine.MAX_BYTES + 1), "larger than"),
    ("{", "not JSON"),
    ("[" * 100000, "not JSON"),
    (json.dumps({"version": 2, "hosts": []}), "version 1"),
    (json.dumps({"version": 1, "hosts": {}}), "version 1"),
    (json.dumps(document(*[entry(f"h{i}") for i in range(quarantine.MAX_ENTRIES + 1)])), "more than 4096 hosts"),
    (json.dumps(document({**entry("h2").to_dict(), "extra": 1})), "host 1: not an object with exactly"),
    (json.dumps(document({**entry("h2").to_dict(), "detail": "\x1b]0;pwned\x07"})), "host 1: detail is not printable"),
    (json.dumps(document({**entry("h2").to_dict(), "cause": "c" * 65})), "host 1: cause is not printable"),
    (json.dumps(document(entry("h2"), {**entry("h3").to_dict(), "host": "h3;rm -rf /"})), "host 2: 'h3;rm -rf /' is not"),
    (json.dumps(document({**entry("h2").to_dict(), "until": "tomorrow"})), "host 1: until is not a time"),
    (json.dumps(document({**entry("h2").to_dict(), "since": True})), "host 1: since is not a time"),
    ('{"version": 1, "hosts": [{"host": "h2", "cause": "x", "detail": "", "run_id": "r", "since": 0, '
     '"until": NaN}]}', "until is not a time"),
    (json.dumps(document(entry("h2", since=5.0, until=4.0))), "until is not within"),
    (json.dumps(document(entry("h2", since=5.0, until=5.0 + 400 * DAY))), "until is not within"),
])
def test_a_document_that_fails_a_check_is_refused_whole(text, why):
    with pytest.raises(quarantine.Unreadable, match=why.replace("(", r"\(")):
        quarantine.parse(text)


def test_added_entries_replace_their_hosts_and_expired_ones_go():
    old = (entry("h1", until=2000.0), entry("h2"), entry("h3"))
    added = (entry("h2", since=3000.0, until=3000.0 + DAY, cause="network"),)
    kept = quarantine.with_added(old, added, now=3000.0)
    assert [(e.host, e.cause) for e in kept] == [("h3", "host-lost"), ("h2", "network")]
    assert quarantine.without(kept, ["h3", "h9"], now=3000.0) == added
    assert quarantine.in_force(kept, now=1000.0 + DAY) == {"h2": added[0]}


def test_the_newest_entries_are_kept_within_the_limit():
    many = tuple(entry(f"h{i}") for i in range(quarantine.MAX_ENTRIES))
    kept = quarantine.with_added(many, (entry("new"),), now=1000.0)
    assert len(kept) == quarantine.MAX_ENTRIES and kept[-1].host == "new" and kept[0].host == "h1"


def test_entries_for_hosts_left_out_are_printable_and_bounded():
    made = quarantine.entries_for({"h2": "host-lost: keepalives\x1b[2J unanswered\n" + "x" * 1000},
                                  "run-7", now=10.0, duration=60.0)
    (one,) = made
    assert (one.host, one.cause, one.run_id, one.since, one.until) == ("h2", "host-lost", "run-7", 10.0, 70.0)
    assert one.detail.startswith("keepalives?[2J unanswered xxx") and len(one.detail) == quarantine.MAX_DETAIL
    assert quarantine.parse(quarantine.render(made)) == made


@pytest.mark.parametrize("text, seconds", [("24h", DAY), ("90m", 5400.0), ("2d", 2 * DAY), ("30", 30.0),
                                           ("1.5h", 5400.0), ("0", 0.0)])
def test_durations(text, seconds):
    assert quarantine.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-1h", "1w", "inf", "nan", "1e9", "31d", "٣h"])
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError):
        quarantine.parse_duration(text)


SPEC = ClusterSpec(tasks=(TaskSpec("chief", "h0", 2222), TaskSpec("worker", "h1", 2222),
                          TaskSpec("worker", "h2", 2222), TaskSpec("worker", "h2", 2223)), spares=("h5", "h6", "h7"))


def test_a_quarantined_host_gives_its_tasks_to_the_first_spare_not_quarantined():
    held = {"h2": entry("h2"), "h5": entry("h5", cause="network")}
    spec, warnings = quarantine.avoiding(SPEC, held)
    assert [(t.role, t.host, t.port) for t in spec.tasks] == [
        ("chief", "h0", 2222), ("worker", "h1", 2222), ("worker", "h6", 2222), ("worker", "h6", 2223)]
    assert spec.spares == ("h7",)
    assert warnings[0].startswith("spare host h5 is quarantined (network in run run-1: SSH keepalives")
    assert warnings[0].endswith("): not used as a spare")
    assert warnings[1].startswith("h2 is quarantined (host-lost in run run-1: ") and \
        warnings[1].endswith("): spare host h6 takes its tasks")


def test_without_a_spare_the_host_keeps_its_tasks_with_a_warning():
    spec, warnings = quarantine.avoiding(SPEC, {"h1": entry("h1"), "h2": entry("h2")} | {
        h: entry(h) for h in ("h5", "h6")})
    assert [t.host for t in spec.tasks] == ["h0", "h7", "h2", "h2"]
    assert warnings[-2].endswith(": spare host h7 takes its tasks")
    assert warnings[-1].endswith("; no spare host takes its place, so it runs its tasks "
                                 "(`mgpu hosts --clear h2` lifts the quarantine)")


def test_this_machine_and_a_slurm_allocation_keep_their_hosts():
    spec, warnings = quarantine.avoiding(SPEC, {"h0": entry("h0")}, this_machine=frozenset({"h0"}))
    assert spec == SPEC and warnings == []
    spec, warnings = quarantine.avoiding(SPEC, {"h1": entry("h1")}, replace=False)
    assert spec == SPEC and len(warnings) == 1 and "no spare host takes its place" in warnings[0]
