"""--sync on hosts where another account has been at work: its folders, links, FIFOs and manifests
in the places the copy goes. Each host's sshd has a tmpfs of its own over NETNS_PRIVATE_DIR (made
world-writable and sticky here, as /tmp is), so what is planted on h1 is h1's alone. The tasks log
in as root; the other account is `nobody`.

A copy the sync made once (the module's first launch) is what the other account finds in most
tests: each gets it as its own folder (`cp -a`, the manifest, modes and times kept) rather than
from a launch of its own, which would make the same copy again."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess

import pytest

import lab_mgpu
from test_sync import launch_on_both, make_project

pytestmark = [pytest.mark.ssh, pytest.mark.netns]

NETNS_PRIVATE_DIR = f"/tmp/mgpu-hostile-{os.getpid()}"
NOBODY = 65534
# The task leaves a file named after the program it ran: train.py (the user's) or the other account's.
TRAIN = "import os\nopen(os.environ['MGPU_TASK_TYPE'] + '-ran-' + open('who').read().strip(), 'w')\n"


@pytest.fixture
def hosts(netns):
    lab, *_ = netns
    for sshd in lab.sshds.values():
        os.chmod(sshd.private_path(NETNS_PRIVATE_DIR), 0o1777)
    return {name: (lambda path, sshd=sshd: sshd.private_path(path)) for name, sshd in lab.sshds.items()}


def project(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = make_project(tmp_path)
    (folder / "main.py").write_text(TRAIN)
    (folder / "who").write_text("user\n")
    return folder


def launch(netns, tmp_path, folder, workdir, *extra):
    return launch_on_both(netns, tmp_path, "--sync", str(folder), "--workdir", workdir, "--no-check", *extra, "--",
                          "python3", "main.py")


TEMPLATE = f"{NETNS_PRIVATE_DIR}/synced"


@pytest.fixture(scope="module")
def synced(netns, tmp_path_factory):
    """The project synced to TEMPLATE on h1 and h2, and its task run there, by one launch."""
    tmp_path = tmp_path_factory.mktemp("synced")
    lab, *_ = netns
    for sshd in lab.sshds.values():
        os.chmod(sshd.private_path(NETNS_PRIVATE_DIR), 0o1777)
    done = launch(netns, tmp_path, project(tmp_path), TEMPLATE)
    assert done.returncode == 0, done.stderr[-3000:]
    return TEMPLATE


def copy_of_the_sync(hosts, synced: str, workdir: str) -> None:
    """`workdir` on h1 and h2 as the first sync left it (the module's, made into that folder)."""
    for name in ("h1", "h2"):
        target = hosts[name](workdir)
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(hosts[name](synced)), str(target)], check=True, timeout=60)


def test_a_manifest_path_outside_the_folder_removes_nothing_there(netns, hosts, synced, tmp_path):
    folder = project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/outside/copy"
    copy_of_the_sync(hosts, synced, workdir)
    victim = hosts["h1"](f"{NETNS_PRIVATE_DIR}/outside/victim.txt")
    victim.write_text("keep me")
    (hosts["h1"](f"{NETNS_PRIVATE_DIR}/outside/victims")).mkdir()
    (hosts["h1"](f"{NETNS_PRIVATE_DIR}/outside/victims/a.txt")).write_text("keep me too")
    manifest = hosts["h1"](f"{workdir}/.mgpu-sync.json")
    held = json.loads(manifest.read_text())
    held["files"]["../victim.txt"] = held["files"]["train.py"]
    held["files"]["../victims/a.txt"] = held["files"]["train.py"]
    manifest.write_text(json.dumps(held))
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert victim.read_text() == "keep me"
    assert (hosts["h1"](f"{NETNS_PRIVATE_DIR}/outside/victims/a.txt")).read_text() == "keep me too"
    assert f"mgpu: warning: sync to h1: {workdir}/.mgpu-sync.json names a path outside the folder" in done.stderr
    # The manifest is set aside whole: every file is sent again, nothing is removed.
    assert f"mgpu: sync h1:{workdir}: 8 file(s) copied" in done.stderr and ", 0 removed" in done.stderr


def test_a_manifest_path_through_a_link_removes_nothing_beyond_it(netns, hosts, synced, tmp_path):
    folder = project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/through/copy"
    copy_of_the_sync(hosts, synced, workdir)
    elsewhere = hosts["h1"](f"{NETNS_PRIVATE_DIR}/through/elsewhere")
    elsewhere.mkdir()
    (elsewhere / "victim.txt").write_text("keep me")
    os.symlink(f"{NETNS_PRIVATE_DIR}/through/elsewhere", hosts["h1"](f"{workdir}/lnk"))
    manifest = hosts["h1"](f"{workdir}/.mgpu-sync.json")
    held = json.loads(manifest.read_text())
    held["files"]["lnk/victim.txt"] = held["files"]["train.py"]
    manifest.write_text(json.dumps(held))
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (elsewhere / "victim.txt").read_text() == "keep me"
    assert "mgpu: warning: sync to h1: lnk/victim.txt was not removed: it lies beyond a link" in done.stderr


def test_a_workdir_another_account_made_is_refused_and_its_program_never_runs(netns, hosts, synced, tmp_path):
    folder = project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/teamproj"
    copy_of_the_sync(hosts, synced, workdir)
    # The other account takes the folder over (as if it had made it first, manifest and all) and
    # puts its own program in: the manifest still names the user's files.
    for name in ("h1", "h2"):
        copy = hosts[name](workdir)
        (copy / "who").write_text("nobody\n")
        for path in [copy, *copy.rglob("*")]:
            os.lchown(path, NOBODY, NOBODY)
        for ran in copy.glob("worker-ran-*"):
            ran.unlink()
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 1, done.stderr[-3000:]
    error = done.stderr[done.stderr.index("mgpu: error:"):]
    assert error.startswith("mgpu: error: sync to h"), error
    assert f"{workdir} belongs to another account (uid {NOBODY}, not 0)" in error
    assert len(error.strip().splitlines()) == 1, error
    for name in ("h1", "h2"):
        assert not list(hosts[name](workdir).glob("worker-ran-*"))
        assert (hosts[name](workdir) / "who").read_text() == "nobody\n"


def test_a_link_in_place_of_a_file_is_replaced_never_chmod_through(netns, hosts, synced, tmp_path):
    folder = project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/linkfile"
    copy_of_the_sync(hosts, synced, workdir)
    secret = hosts["h1"](f"{NETNS_PRIVATE_DIR}/shadow")
    secret.write_text("hashes")
    secret.chmod(0o600)
    placed = hosts["h1"](f"{workdir}/run.sh")
    placed.unlink()
    os.symlink(f"{NETNS_PRIVATE_DIR}/shadow", placed)
    (folder / "run.sh").chmod(0o755)  # a mode change: the sync would chmod run.sh in place
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text() == "hashes"
    assert not placed.is_symlink() and placed.read_text() == "#!/bin/sh\necho run\n"
    assert stat.S_IMODE(placed.stat().st_mode) == 0o755


def test_a_link_in_place_of_the_workdir_is_refused(netns, hosts, tmp_path):
    folder = project(tmp_path)
    protected = hosts["h1"](f"{NETNS_PRIVATE_DIR}/rootonly")
    protected.mkdir(mode=0o700)
    (protected / "main.py").write_text("root's own")
    workdir = f"{NETNS_PRIVATE_DIR}/pointed"
    for name in ("h1", "h2"):
        os.symlink(f"{NETNS_PRIVATE_DIR}/rootonly", hosts[name](workdir))
        os.lchown(hosts[name](workdir), NOBODY, NOBODY)
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"{workdir} is a symbolic link; mgpu writes only in a real folder" in done.stderr
    assert (protected / "main.py").read_text() == "root's own"
    assert sorted(p.name for p in protected.iterdir()) == ["main.py"]


def test_a_fifo_as_the_manifest_is_set_aside_without_opening_it(netns, hosts, tmp_path):
    folder = project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/fifo"
    for name in ("h1", "h2"):
        hosts[name](workdir).mkdir()
        os.mkfifo(hosts[name](f"{workdir}/.mgpu-sync.json"))
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{workdir}/.mgpu-sync.json is not a regular file of this account's; mgpu ignores it" in done.stderr
    for name in ("h1", "h2"):
        manifest = hosts[name](f"{workdir}/.mgpu-sync.json")
        assert stat.S_ISREG(manifest.lstat().st_mode)  # the copy's own manifest took its place
        assert list(hosts[name](workdir).glob("worker-ran-user"))


@pytest.mark.parametrize("where, mode, refused", [
    ("workdir", 0o775, "is writable by other accounts (mode 0775)"),
    ("parent", 0o777, "is writable by other accounts and not sticky (mode 0777)"),
    ("parent", 0o1777, None),  # sticky, as /tmp: no one else can take the account's folder away
])
def test_folders_others_can_write_are_refused_unless_sticky_above_the_workdir(netns, hosts, tmp_path, where, mode,
                                                                             refused):
    folder = project(tmp_path)
    parent = f"{NETNS_PRIVATE_DIR}/modes-{where}-{mode:o}"
    workdir = f"{parent}/copy"
    for name in ("h1", "h2"):
        hosts[name](workdir).mkdir(parents=True)
        hosts[name](parent if where == "parent" else workdir).chmod(mode)
    done = launch(netns, tmp_path, folder, workdir)
    if refused is None:
        assert done.returncode == 0, done.stderr[-3000:]
        return
    assert done.returncode == 1, done.stderr[-3000:]
    assert refused in done.stderr, done.stderr[-3000:]
    assert not hosts["h1"](f"{workdir}/main.py").exists()


def test_a_file_changed_on_the_host_is_copied_again_whatever_the_manifest_says(netns, hosts, synced, tmp_path):
    folder = project(tmp_path)
    workdir = f"{NETNS_PRIVATE_DIR}/changed"
    copy_of_the_sync(hosts, synced, workdir)
    hosts["h1"](f"{workdir}/who").write_text("someone else\n")
    done = launch(netns, tmp_path, folder, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"mgpu: sync h1:{workdir}: 1 file(s) copied" in done.stderr
    assert f"mgpu: sync h2:{workdir}: 0 file(s) copied" in done.stderr
    assert hosts["h1"](f"{workdir}/who").read_text() == "user\n"


def test_a_host_without_tar_gets_each_file_over_sftp_and_nothing_through_a_link(ssh_lab, tmp_path):
    """A host whose sessions find no tar: the files go one at a time over SFTP, by the same rules."""
    from ssh_tasks import forced_host

    no_tar = tmp_path / "bin"
    no_tar.mkdir()
    for tool in pathlib.Path("/usr/bin").iterdir():
        if tool.name != "tar":
            (no_tar / tool.name).symlink_to(tool)
    folder = project(tmp_path)
    workdir = tmp_path / "copy"
    secret = tmp_path / "shadow"
    secret.write_text("hashes")
    secret.chmod(0o600)
    with forced_host(ssh_lab, tmp_path, "notar", f'export PATH={no_tar}; eval "$SSH_ORIGINAL_COMMAND"') as (known,
                                                                                                        config):
        def sync():
            return lab_mgpu.run(tmp_path, "launch", "--workers", "notar:2222", "--ssh-config", str(config),
                                "--known-hosts", str(known), "--sync", str(folder), "--workdir", str(workdir),
                                "--no-check", "--", "/bin/true", timeout=120)

        first = sync()
        assert first.returncode == 0, first.stderr[-3000:]
        assert f"mgpu: sync notar:{workdir}: 8 file(s) copied" in first.stderr
        assert (workdir / "train.py").read_text() == (folder / "train.py").read_text()
        assert stat.S_IMODE((workdir / "run.sh").stat().st_mode) == 0o750
        assert os.readlink(workdir / "latest") == "data/a.txt"
        (workdir / "run.sh").unlink()
        os.symlink(secret, workdir / "run.sh")
        (folder / "run.sh").chmod(0o755)
        second = sync()
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"mgpu: sync notar:{workdir}: 1 file(s) copied" in second.stderr
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text() == "hashes"
    assert not (workdir / "run.sh").is_symlink() and stat.S_IMODE((workdir / "run.sh").stat().st_mode) == 0o755
