"""The quarantine file: private, changed under a lock by runs at once without losing an entry, and
a file that is not what mgpu writes set aside with one warning, never an error."""

import json
import os
import stat
import subprocess
import sys
import time

from launcher.config.quarantine import Entry, render
from launcher.host.quarantine_file import FILE_NAME, QuarantineFile, state_folder
from launching import REPO

NOW = time.time()  # what clear() reads too: entries must not have expired by then


def entry(host: str) -> Entry:
    return Entry(host, "host-lost", "a fresh login fails", "run-1", NOW, NOW + 3600)


def test_the_folder_is_the_users_state_directory(tmp_path):
    assert state_folder({"XDG_STATE_HOME": str(tmp_path)}) == str(tmp_path / "mgpu")
    home = os.path.expanduser("~")
    assert state_folder({"XDG_STATE_HOME": "relative/path"}) == os.path.join(home, ".local", "state", "mgpu")
    assert state_folder({}) == os.path.join(home, ".local", "state", "mgpu")


def test_entries_are_written_private_and_lifted(tmp_path):
    keeper = QuarantineFile(str(tmp_path / "state" / "mgpu"))
    assert keeper.entries(NOW) == () and not (tmp_path / "state").exists()  # reading makes nothing
    os.umask(0o022)
    assert keeper.change(lambda entries, now: (entry("h2"), entry("h3")), NOW)
    assert stat.S_IMODE(os.stat(keeper.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(keeper.folder).st_mode) == 0o700
    assert [e.host for e in keeper.entries(NOW)] == ["h2", "h3"]
    assert keeper.entries(NOW + 3600) == ()  # expired
    assert keeper.clear(["h2"])
    assert [e.host for e in keeper.entries(NOW)] == ["h3"]
    assert sorted(os.listdir(keeper.folder)) == [FILE_NAME, "quarantine.lock"]  # no temporary file left


def test_a_bad_file_is_set_aside_with_one_warning(tmp_path):
    warnings = []
    keeper = QuarantineFile(str(tmp_path), warn=warnings.append)
    (tmp_path / FILE_NAME).write_text('{"version": 1, "hosts": [{"host": "h2"}]}')
    assert keeper.entries(NOW) == ()
    (aside,) = [name for name in os.listdir(tmp_path) if name.startswith(f"{FILE_NAME}.bad-")]
    assert warnings == [f"the quarantine file {keeper.path} is unreadable (host 1: not an object with exactly host, "
                        f"cause, detail, run_id, since, until): set aside as {tmp_path / aside}; no host is taken "
                        f"as quarantined"]
    assert keeper.entries(NOW) == () and len(warnings) == 1  # no file now: nothing more to say
    assert (tmp_path / aside).read_text().startswith('{"version": 1')


def test_a_link_or_another_users_file_is_set_aside_not_followed(tmp_path):
    warnings = []
    keeper = QuarantineFile(str(tmp_path), warn=warnings.append)
    target = tmp_path / "elsewhere.json"
    target.write_text(render([entry("h2")]))
    (tmp_path / FILE_NAME).symlink_to(target)
    assert keeper.add([entry("h5")])
    assert "(a symbolic link)" in warnings[0]
    assert target.read_text() == render([entry("h2")])  # not written through the link
    (tmp_path / FILE_NAME).write_text(render([entry("h2")]))
    os.chown(tmp_path / FILE_NAME, 65534, 65534)
    assert keeper.entries(NOW) == ()
    assert "(not a regular file of this user's)" in warnings[1]


def test_an_unwritable_folder_is_a_warning(tmp_path):
    warnings = []
    (tmp_path / "file").write_text("")
    keeper = QuarantineFile(str(tmp_path / "file" / "mgpu"), warn=warnings.append)
    assert not keeper.add([entry("h2")])
    assert warnings == [f"cannot write the quarantine file {keeper.path}: Not a directory"]


ADDER = """
import sys, time
from launcher.config.quarantine import Entry
from launcher.host.quarantine_file import QuarantineFile
keeper, name, count = QuarantineFile(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(count):
    now = time.time()
    assert keeper.add([Entry(f"{name}-{i}", "network", "", name, now, now + 3600)])
"""


def test_two_runs_adding_at_once_lose_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    count = 60
    procs = [subprocess.Popen([sys.executable, "-c", ADDER, str(tmp_path), name, str(count)], env=env)
             for name in ("a", "b")]
    try:
        assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    hosts = {item["host"] for item in json.loads((tmp_path / FILE_NAME).read_text())["hosts"]}
    assert hosts == {f"{name}-{i}" for name in "ab" for i in range(count)}
