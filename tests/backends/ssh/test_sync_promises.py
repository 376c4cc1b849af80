"""What docs/ssh.md promises of --sync, each held end to end on two hosts that share no folder:
the digest every task gets is of the files it runs, a mode is fixed in place without a copy, the
files a run wrote are left alone, and a file that changes while it is copied stops the launch."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from launcher.config.sync import DEFAULT_SYNC_MAX_BYTES
from launcher.intake.sync_folder import read_synced_folder
from ssh_helpers import PYTHON, unique_run_id
from test_sync import launch_on_both, make_project

pytestmark = [pytest.mark.ssh, pytest.mark.netns]

NETNS_PRIVATE_DIR = f"/tmp/mgpu-promised-{os.getpid()}"

# Prints the digest it was given, and writes an output of its own beside the program.
DIGEST = "import os\nprint('DIGEST', os.environ['MGPU_SYNC_DIGEST'], flush=True)\nopen('out.ckpt', 'w').write('mine')\n"


def on_host(netns, name, path):
    lab, *_ = netns
    return lab.sshds[name].private_path(path)


def digests(done) -> set[str]:
    return {line.split()[-1] for line in done.stdout.splitlines() if " DIGEST " in line}


def test_each_task_gets_the_digest_of_the_files_it_runs_and_a_change_changes_it(netns, tmp_path):
    project = make_project(tmp_path)
    (project / "digest.py").write_text(DIGEST)
    workdir = f"{NETNS_PRIVATE_DIR}/digest"
    first = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--", PYTHON,
                           "digest.py")
    assert first.returncode == 0, first.stderr[-3000:]
    assert digests(first) == {read_synced_folder(str(project), DEFAULT_SYNC_MAX_BYTES).digest}
    (project / "data" / "a.txt").write_text("data-b")
    second = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--", PYTHON,
                            "digest.py")
    assert second.returncode == 0, second.stderr[-3000:]
    now = read_synced_folder(str(project), DEFAULT_SYNC_MAX_BYTES).digest
    assert digests(second) == {now} and digests(first) != digests(second)
    for name in ("h1", "h2"):
        assert json.loads(on_host(netns, name, f"{workdir}/.mgpu-sync.json").read_text())["digest"] == now


def test_a_mode_is_fixed_in_place_and_the_files_a_run_wrote_are_left_alone(netns, tmp_path):
    project = make_project(tmp_path)
    (project / "digest.py").write_text(DIGEST)
    workdir = f"{NETNS_PRIVATE_DIR}/modes"
    first = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--", PYTHON,
                           "digest.py")
    assert first.returncode == 0, first.stderr[-3000:]
    inode = {name: on_host(netns, name, f"{workdir}/run.sh").stat().st_ino for name in ("h1", "h2")}
    (project / "run.sh").chmod(0o700)
    second = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--",
                            "/bin/true")
    assert second.returncode == 0, second.stderr[-3000:]
    for name in ("h1", "h2"):
        assert f"mgpu: sync {name}:{workdir}: 0 file(s) copied (0 B), 0 removed, 7 unchanged" in second.stderr
        run_sh = on_host(netns, name, f"{workdir}/run.sh")
        assert stat.S_IMODE(run_sh.stat().st_mode) == 0o700 and run_sh.stat().st_ino == inode[name]
        assert on_host(netns, name, f"{workdir}/out.ckpt").read_text() == "mine"  # the run's own output


def test_a_file_that_changes_while_it_is_copied_stops_the_launch(netns, tmp_path):
    project = make_project(tmp_path)
    big = project / "weights.bin"
    big.write_bytes(b"\0" * (64 << 20))
    workdir = f"{NETNS_PRIVATE_DIR}/changing"
    stop = threading.Event()

    def keep_changing():
        # Appends while the launch reads the folder and copies it: the copy never matches the plan.
        with open(big, "ab") as f:
            while not stop.wait(0.01):
                f.write(b"x" * 4096)
                f.flush()

    writer = threading.Thread(target=keep_changing, daemon=True)
    run_id = unique_run_id("changing")
    writer.start()
    try:
        done = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--run-id",
                              run_id, "--sync-max-size", "4G", "--", PYTHON, "-c", "open('started', 'w')")
    finally:
        stop.set()
        writer.join(10)
    assert done.returncode == 1, done.stderr[-3000:]
    error = done.stderr[done.stderr.index("mgpu: error:"):]
    assert error.startswith("mgpu: error: sync: ") and "weights.bin changed while mgpu was copying it; launch again" \
        in error, error
    for name in ("h1", "h2"):
        assert not on_host(netns, name, f"{workdir}/started").exists()
