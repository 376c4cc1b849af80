"""samples.jsonl (samples.py): bounded for weeks, whole lines after a crash or a full disk. Real files
in a real run folder; no processes but for the tmpfs mount."""

import errno
import json
import os
import shutil
import subprocess

import pytest

from launcher.supervise import samples
from launcher.supervise.rundir import RunDir
from launcher.supervise.samples import SampleFile, downsampled, read


def run_dir(path) -> RunDir:
    path.mkdir(exist_ok=True)
    return RunDir(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY))


def sample(i: int) -> dict:
    return {"at": 1000.0 + 2 * i, "attempt": 0, "steps": {"worker:0": i}, "busy": {"worker:0": 0.5}}


def test_four_weeks_of_samples_stay_within_the_bound_recent_ones_whole_old_ones_coarser_the_first_kept():
    interval, limit = 600.0, 256  # a sample every 10 min for four weeks: the same shape as 2 s and 4096, faster
    lines: list[tuple[float, str]] = []
    total = 4 * 7 * 24 * 6
    for i in range(total):
        if len(lines) >= limit:
            lines = downsampled(lines, limit, interval)
        lines.append((i * interval, str(i)))
        assert len(lines) <= limit
    kept = [int(line) for _, line in lines]
    assert kept == sorted(kept) and kept[0] == 0 and kept[-1] == total - 1
    assert kept[-limit // 16:] == list(range(total - limit // 16, total))  # the newest, every one
    gaps = [b - a for a, b in zip(kept, kept[1:])]
    assert max(gaps[: len(gaps) // 4]) > max(gaps[-len(gaps) // 4:])  # older, coarser
    for week in range(4):  # every week of the run is still there
        assert any(week * 7 * 24 * 6 <= i < (week + 1) * 7 * 24 * 6 for i in kept), week


def test_the_file_holds_no_more_than_its_bound_and_the_newest_sample(tmp_path):
    folder = run_dir(tmp_path / "run")
    notes = []
    kept = SampleFile(folder, notes.append, max_samples=32)
    for i in range(200):
        kept.add(sample(i))
    kept.close()
    found = read((tmp_path / "run" / samples.NAME).read_text())
    steps = [s["steps"]["worker:0"] for s in found]
    assert len(found) <= 32 and not notes and steps[0] == 0 and steps[-1] == 199


def test_a_line_cut_short_is_skipped_by_readers_and_the_next_line_starts_fresh(tmp_path):
    folder = run_dir(tmp_path / "run")
    kept = SampleFile(folder, print)
    kept.add(sample(0))
    with open(tmp_path / "run" / samples.NAME, "a") as f:  # what a crash in the middle of a write leaves
        f.write('{"at": 1002.0, "steps": {"work')
    kept._cut = True
    kept.add(sample(2))
    kept.close()
    found = read((tmp_path / "run" / samples.NAME).read_text())
    assert [s["steps"]["worker:0"] for s in found] == [0, 2]
    assert read('[1]\n"x"\n{"a": 1}\n' + "{" * 100000 + "\n") == [{"a": 1}]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a small tmpfs needs root")
def test_on_a_full_disk_samples_are_dropped_said_once_and_added_again_once_there_is_room(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(disk)], check=True, timeout=30)
    try:
        folder = run_dir(disk / "run")
        notes = []
        kept = SampleFile(folder, notes.append, max_samples=8)
        kept.add(sample(0))
        with open(disk / "filler", "wb", buffering=0) as f:
            try:
                for _ in range(1000):
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        for i in range(1, 20):  # appends fail, and so do the rewrites
            kept.add(sample(i))
        assert len(notes) == 1 and "cannot write samples.jsonl in " in notes[0], notes
        os.unlink(disk / "filler")
        kept.add(sample(20))
        kept.close()
        text = (disk / "run" / samples.NAME).read_text()
        assert all(json.loads(line) for line in text.splitlines() if line.startswith("{") and line.endswith("}"))
        steps = [s["steps"]["worker:0"] for s in read(text)]
        assert steps[0] == 0 and steps[-1] == 20 and len(steps) <= 8, steps
        assert not (disk / "run" / (samples.NAME + ".tmp")).exists()
    finally:
        os.close(folder.fd)
        subprocess.run(["umount", "-l", str(disk)], check=True, timeout=30)
