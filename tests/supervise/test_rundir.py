"""The run directory and run ids against another user of the machine (the real user `nobody`):
nothing another user plants can redirect what a launch writes, or what it kills."""

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

import needs

from launcher.errors import UsageError
from launcher.supervise.options import SuperviseOptions
from launcher.supervise import run_lock
from launcher.supervise.rundir import check_run_dir, make_run_dir
from launcher.supervise.run_lock import run_id_lock_dir
from launching import run_mgpu, start_mgpu, wait_for

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

# Acting as another user needs root and setpriv: skipped elsewhere, a failure on CI (needs.root).
needs_root = pytest.mark.usefixtures("as_root_with_setpriv")


@pytest.fixture
def as_root_with_setpriv():
    needs.root("setpriv")


@pytest.fixture
def shared_dir():
    """A folder under /tmp that `nobody` can reach (pytest's tmp_path is private to root)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="mgpu-shared-", dir="/tmp"))
    path.chmod(0o1777)  # like /tmp
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(script: str) -> None:
    subprocess.run([*AS_NOBODY, "/bin/sh", "-c", script], check=True, timeout=30)


def launch(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return run_mgpu("launch", "--local", "1", *args, "--", "true", cwd=cwd)


@needs_root
def test_a_planted_run_dir_link_receives_nothing(shared_dir, tmp_path):
    # A sticky, world-writable log dir (like /tmp): nobody plants RUNID -> a folder of theirs.
    log_dir = shared_dir / "runs"
    log_dir.mkdir(mode=0o1777)
    log_dir.chmod(0o1777)
    as_nobody(f"mkdir {shared_dir}/loot && chmod 777 {shared_dir}/loot && ln -s {shared_dir}/loot {log_dir}/r1")
    result = launch("--log-dir", str(log_dir), "--run-id", "r1", "--env", "TOKEN=s3cret", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"mgpu: error: run r1 already exists in {log_dir / 'r1'}; choose another run id\n"
    assert list((shared_dir / "loot").iterdir()) == []


@needs_root
def test_a_log_dir_of_another_user_is_refused(shared_dir, tmp_path):
    as_nobody(f"mkdir {shared_dir}/theirs")
    result = launch("--log-dir", str(shared_dir / "theirs"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"mgpu: error: --log-dir {shared_dir / 'theirs'}: owned by nobody (uid 65534), "
                             f"not by you; use a log dir of your own\n")
    assert list((shared_dir / "theirs").iterdir()) == []


@needs_root
def test_a_log_dir_others_can_write_without_the_sticky_bit_is_refused(shared_dir, tmp_path):
    open_dir = shared_dir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    result = launch("--log-dir", str(open_dir), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f"mgpu: error: --log-dir {open_dir}: writable by other users without the sticky bit; "
                             f"make it private (chmod go-w) or use another\n")
    assert list(open_dir.iterdir()) == []


@needs_root
def test_processes_of_another_user_neither_block_a_run_id_nor_get_killed(shared_dir, tmp_path):
    # nobody tags a process of theirs with the run id a root launch will use.
    theirs = subprocess.Popen([*AS_NOBODY, "env", "MGPU_RUN_ID=shared-id", "sleep", "60"])
    try:
        result = launch("--log-dir", str(tmp_path / "runs"), "--run-id", "shared-id", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert theirs.poll() is None
    finally:
        theirs.kill()
        theirs.wait()


def test_files_in_the_run_dir_are_never_opened_through_links(tmp_path):
    run_dir = make_run_dir(SuperviseOptions(run_id="r", log_dir=tmp_path))
    try:
        target = tmp_path / "elsewhere"
        target.write_text("keep\n")
        (tmp_path / "r" / "worker-0.log").symlink_to(target)
        (tmp_path / "r" / "run.json.tmp").symlink_to(target)
        with pytest.raises(OSError):
            run_dir.open_log("worker-0.log")
        with pytest.raises(FileExistsError):
            run_dir.create("run.json.tmp")
        assert target.read_text() == "keep\n"
    finally:
        run_dir.close()


def test_two_launches_with_one_run_id_cannot_both_claim_it(tmp_path):
    options = SuperviseOptions(run_id="same", log_dir=tmp_path)
    check_run_dir(options)
    check_run_dir(options)  # both pass the early check...
    first = make_run_dir(options)
    try:
        with pytest.raises(UsageError, match="run same already exists"):
            make_run_dir(options)  # ...but only one wins the mkdir
    finally:
        first.close()
    assert stat.S_IMODE((tmp_path / "same").stat().st_mode) == 0o700


def test_default_run_ids_carry_128_random_bits():
    from launcher.intake.load import new_run_id

    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(run_id.rsplit("-", 1)[1]) == 32 for run_id in ids)


def test_run_json_hides_given_env_values_unless_asked(tmp_path):
    for extra, shown in (((), False), (("--show-secrets",), True)):
        run_id = f"secrets-{int(shown)}"
        result = launch("--log-dir", str(tmp_path / "runs"), "--run-id", run_id, "--env", "TOKEN=s3cret-value",
                        *extra, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        record = (tmp_path / "runs" / run_id / "run.json").read_text()
        assert ("s3cret-value" in record) == shown
        assert '"TOKEN": "***"' in record or shown
        assert "TF_CONFIG" in record and run_id in record


def test_renaming_the_run_dir_during_a_run_redirects_nothing(tmp_path):
    # What a rename swap would do: the path now names another folder; the run keeps writing to its own.
    runs = tmp_path / "runs"
    go = tmp_path / "go"
    task = ("import os, sys, time\n"
            "deadline = time.monotonic() + 120\n"
            f"while not os.path.exists({str(go)!r}):\n"
            "    if time.monotonic() > deadline: sys.exit('never told to go on')\n"
            "    time.sleep(0.05)\n"
            "print('late')\n")
    proc = start_mgpu("launch", "--local", "1", "--log-dir", str(runs), "--run-id", "swap", "--",
                      sys.executable, "-c", task, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_for(lambda: (runs / "swap" / "run.json").exists(), 60, what="the run to start")
        (runs / "swap").rename(runs / "moved")
        (runs / "swap").mkdir()
        assert proc.poll() is None  # the task waits for `go`: the run is still going
        go.touch()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    assert list((runs / "swap").iterdir()) == []
    assert (runs / "moved" / "worker-0.log").read_text() == "late\n"
    assert '"status": "succeeded"' in (runs / "moved" / "run.json").read_text()


def test_the_run_id_lock_folder_is_private_to_its_user(tmp_path):
    result = launch("--log-dir", str(tmp_path / "runs"), "--run-id", f"lock-{os.getpid()}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    st = os.stat(run_id_lock_dir(), follow_symlinks=False)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700


@needs_root
def test_a_run_id_lock_folder_of_another_user_or_open_to_others_is_refused(tmp_path, monkeypatch):
    # The folder's place is redirected (the machine's own is shared by every launch); the checks are mgpu's.
    folder = tmp_path / "locks"
    monkeypatch.setattr(run_lock, "run_id_lock_dir", lambda: str(folder))
    run_lock.claim_run_id("made")  # made when missing, private
    run_lock.release_run_id("made")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o750)
    with pytest.raises(UsageError, match=f"^{folder}: open to others \\(mode 0750\\); .*: make it private "
                                         f"\\(chmod 700 {folder}\\) or remove it$"):
        run_lock.claim_run_id("open")
    folder.chmod(0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(UsageError, match=f"^{folder}: owned by nobody \\(uid 65534\\), not by you; "):
        run_lock.claim_run_id("theirs")
    assert sorted(p.name for p in folder.iterdir()) == []  # nothing was locked in either


VICTIM_UID = 61234  # a user with no files on this machine, whose launch this test plays


def claim_as(uid: int, run_id: str, env: dict[str, str]) -> str:
    """Claim `run_id` in a child that has become user `uid` with `env` (Python and mgpu are already
    loaded: the interpreter itself is not readable by other users here). "claimed in FOLDER", or the error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.environ.clear()
            os.environ.update(env)
            try:
                run_lock.claim_run_id(run_id)
                answer = f"claimed in {run_lock.run_id_lock_dir()}"
                assert os.path.isfile(os.path.join(run_lock.run_id_lock_dir(), f"{run_id}.lock"))
                run_lock.release_run_id(run_id)
            except UsageError as e:
                answer = str(e)
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        answer = f.read().decode()
    os.waitpid(pid, 0)
    return answer


@needs_root
def test_a_lock_folder_another_user_made_first_is_named_with_the_way_out(shared_dir):
    # nobody makes /tmp/mgpu-<victim's uid> first (sticky /tmp: the victim cannot remove it). The
    # victim's launch is refused naming the owner and the fix; with XDG_RUNTIME_DIR (a folder of
    # the victim's own, as a login session has), its launches do not go through /tmp at all.
    planted = pathlib.Path(f"/tmp/mgpu-{VICTIM_UID}")
    runtime = shared_dir / "run-user"
    shutil.rmtree(planted, ignore_errors=True)
    try:
        as_nobody(f"mkdir -m 700 {planted}")
        answer = claim_as(VICTIM_UID, "r1", {"PATH": "/usr/bin:/bin"})
        assert answer == (f"{planted}: owned by nobody (uid 65534), not by you; mgpu keeps its run id locks there. "
                          f"Ask nobody (uid 65534) or an administrator to remove it, or set XDG_RUNTIME_DIR to a "
                          f"folder of yours that only you can open (mode 0700)"), answer
        runtime.mkdir(mode=0o700)
        os.chown(runtime, VICTIM_UID, VICTIM_UID)
        assert claim_as(VICTIM_UID, "r1", {"XDG_RUNTIME_DIR": str(runtime)}) == f"claimed in {runtime}/mgpu"
        assert stat.S_IMODE((runtime / "mgpu").stat().st_mode) == 0o700
        os.chown(runtime, 65534, 65534)  # an XDG_RUNTIME_DIR not the user's own is not used
        assert claim_as(VICTIM_UID, "r1", {"XDG_RUNTIME_DIR": str(runtime)}).startswith(f"{planted}: owned by nobody")
    finally:
        shutil.rmtree(planted, ignore_errors=True)
