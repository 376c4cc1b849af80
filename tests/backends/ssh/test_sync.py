"""--sync and --setup on two hosts that share no folder: each host's sshd has a tmpfs of its own
over NETNS_PRIVATE_DIR (conftest's netns fixture), so what one host gets the other does not see,
and neither does this machine."""

from __future__ import annotations

import json
import os
import pathlib
import stat

import pytest

import lab_mgpu
from ssh_helpers import PYTHON, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns]

NETNS_PRIVATE_DIR = f"/tmp/mgpu-private-{os.getpid()}"

# Prints what it runs from: its version line, a data file, and where it is.
TRAIN = 'VERSION = "v1"\nimport os\nprint(VERSION, open("data/a.txt").read().strip(), os.getcwd(), flush=True)\n'


def launch_on_both(netns, cwd, *args: str, timeout: float = 120):
    """`mgpu launch` on h1 and h2 of the lab, to its end."""
    return lab_mgpu.run(cwd, "launch", "--workers", "h1:2222,h2:2222", *lab_mgpu.ssh_files(netns), *args,
                        timeout=timeout)


def make_project(root: pathlib.Path) -> pathlib.Path:
    project = root / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / "data" / "a.txt").write_text("data-a")
    (project / "data" / "old.txt").write_text("to be removed")
    (project / "run.sh").write_text("#!/bin/sh\necho run\n")
    (project / "run.sh").chmod(0o750)
    (project / "latest").symlink_to("data/a.txt")
    (project / "scratch.log").write_text("left out")
    (project / ".mgpuignore").write_text("*.log\n")
    return project


def on_host(netns, name: str, path: str) -> pathlib.Path:
    lab, *_ = netns
    return lab.sshds[name].private_path(path)


def test_a_project_is_synced_to_hosts_that_share_nothing_and_runs_there(netns, tmp_path):
    project = make_project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/first"
    run_id = unique_run_id("sync")
    done = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--run-id", run_id, "--",
                          PYTHON, "train.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("h1", "h2"):
        assert f"mgpu: sync {name}:{workdir}: 6 file(s) copied" in done.stderr, done.stderr
        copy = on_host(netns, name, workdir)
        assert (copy / "train.py").read_text() == TRAIN
        assert stat.S_IMODE((copy / "run.sh").stat().st_mode) == 0o750
        assert os.readlink(copy / "latest") == "data/a.txt"
        assert not (copy / "scratch.log").exists()  # .mgpuignore
    # The hosts share no folder: this machine has none of it.
    assert not pathlib.Path(workdir).exists() or not any(pathlib.Path(workdir).iterdir())
    for index in (0, 1):
        assert f"[worker:{index}] v1 data-a {workdir}" in done.stdout
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    digests = {p["env"]["MGPU_SYNC_DIGEST"] for p in record["plans"]} | {p["sync"]["digest"] for p in record["plans"]}
    assert len(digests) == 1 and len(digests.pop()) == 64
    assert not run_processes(run_id)


def test_a_changed_file_is_the_only_one_copied_and_a_deleted_one_goes(netns, tmp_path):
    project = make_project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/second"
    first = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--", PYTHON,
                           "train.py")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (project / "train.py").write_text(TRAIN.replace("v1", "v2"))
    (project / "data" / "old.txt").unlink()
    second = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--no-check", "--", PYTHON,
                            "train.py")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for name in ("h1", "h2"):
        assert f"mgpu: sync {name}:{workdir}: 1 file(s) copied ({len(TRAIN)} B), 1 removed, 4 unchanged" \
               in second.stderr, second.stderr
        assert not on_host(netns, name, f"{workdir}/data/old.txt").exists()
        assert on_host(netns, name, f"{workdir}/data/a.txt").exists()
    for index in (0, 1):
        assert f"[worker:{index}] v2 data-a {workdir}" in second.stdout
    # The digest the tasks get after the change: test_sync_promises.py.


def test_a_failing_setup_names_its_host_and_starts_nothing(netns, tmp_path):
    project = make_project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/third"
    # Only h2 has the marker (its folder is its own): the setup fails there alone.
    marker = on_host(netns, "h2", f"{NETNS_PRIVATE_DIR}/broken")
    marker.write_text("")
    try:
        run_id = unique_run_id("setup")
        done = launch_on_both(netns, tmp_path, "--sync", str(project), "--workdir", workdir, "--run-id", run_id,
                              "--no-check", "--env", "GREETING=hello", "--setup",
                              f'echo "$GREETING from $(pwd) ${{TF_CONFIG:-no TF_CONFIG}}"; '                                f'[ -e {NETNS_PRIVATE_DIR}/broken ] && {{ echo "no compiler here" >&2; exit 3; }}; true',
                              "--", PYTHON, "-c", "open('started', 'w')")
    finally:
        marker.unlink()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"[setup h1] hello from {workdir} no TF_CONFIG" in done.stdout
    assert "[setup h2] no compiler here" in done.stdout
    error = done.stderr[done.stderr.index("mgpu: error:"):]
    assert error.startswith("mgpu: error: setup failed on h2: exit code 3; nothing was started"), error
    assert "  no compiler here" in error
    run_dir = tmp_path / "mgpu-runs" / run_id
    # stdout and stderr are two streams: the log has both, in the order they arrived.
    assert sorted((run_dir / "setup-h2.log").read_text().splitlines()) == [f"hello from {workdir} no TF_CONFIG",
                                                                          "no compiler here"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["setup-h1.log", "setup-h2.log"]
    for name in ("h1", "h2"):
        assert not on_host(netns, name, f"{workdir}/started").exists()

