"""A run is found running, and stopped, from any shell of its user: whatever XDG_RUNTIME_DIR says
there, the run's record says where its run id's lock is; and its run id is refused to a launch from
such a shell. Played by a user with no files on this
machine (root's locks are always in /run/mgpu), in children of this process that become that user."""

import codecs
import contextlib
import io
import os
import pathlib
import shutil
import signal
import tempfile
import time

import pytest

from launcher.errors import UsageError
import launcher.cli.runs  # noqa: F401  the commands, loaded here: the user cannot read this checkout
from launcher.cli.main import main
from launcher.supervise import run_lock, runs
from launcher.supervise.rundir import RunDir
from launcher.supervise.runrecord import RunRecord

codecs.lookup("ascii")  # the codecs the commands use, found before the children cannot look
USER = 61235  # a user of its own: no other test's lock folders

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


@pytest.fixture
def shared_dir():
    """A folder under /tmp that the user can reach (pytest's tmp_path is private to root)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="mgpu-shell-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(f"/tmp/mgpu-{USER}", ignore_errors=True)


@pytest.fixture
def login_runtime():
    """The user's /run/user/<uid>, as a login session makes it; removed at the end."""
    path = pathlib.Path(f"/run/user/{USER}")
    path.mkdir(mode=0o700, parents=True)
    os.chown(path, USER, USER)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(env: dict[str, str], body) -> int:
    """Fork a child that becomes USER with `env` and runs `body()` (its return value goes into the
    child's exit status). The child never returns into pytest."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgroups([])
            os.setgid(USER)
            os.setuid(USER)
            os.environ.clear()
            os.environ.update(env)
            code = body()
        finally:
            os._exit(code)
    return pid


@needs_root
def test_a_run_is_running_and_stoppable_from_a_shell_with_another_runtime_dir(shared_dir):
    runtime = shared_dir / "runtime"  # the launching shell's XDG_RUNTIME_DIR, private to the user
    runtime.mkdir(mode=0o700)
    os.chown(runtime, USER, USER)
    log_dir = shared_dir / "runs"
    log_dir.mkdir(mode=0o755)
    os.chown(log_dir, USER, USER)
    run_id = f"shell-{os.getpid()}"
    go_read, go_write = os.pipe()  # the supervisor's stand-in says through it that its record is written

    def supervisor() -> int:
        # Claims the run id and writes the run's record as a launch does, then waits to be stopped.
        os.close(go_read)
        run_lock.claim_run_id(run_id)
        os.mkdir(log_dir / run_id, 0o700)
        fd = os.open(log_dir / run_id, os.O_RDONLY | os.O_DIRECTORY)
        RunRecord(RunDir(log_dir / run_id, fd), run_id, [], {"grace_period": 1.0})
        os.write(go_write, b"up")
        os.close(go_write)
        for _ in range(600):  # until `mgpu stop` (SIGTERM) ends it; a minute at most
            time.sleep(0.1)
        return 0

    holder = as_user({"XDG_RUNTIME_DIR": str(runtime)}, supervisor)
    os.close(go_write)
    try:
        with os.fdopen(go_read, "rb") as f:
            assert f.read() == b"up"
        assert (runtime / "mgpu" / f"{run_id}.lock").exists()
        out = shared_dir / "stop.out"

        def another_shell() -> int:
            # No XDG_RUNTIME_DIR here: status sees the run running, and stop stops it.
            state = runs.find(log_dir, run_id).state
            text = io.StringIO()
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                try:
                    main(["stop", run_id, "--log-dir", str(log_dir)])
                except SystemExit as e:
                    code = e.code
            out.write_text(f"{state}\n{code}\n{text.getvalue()}")
            return 0

        reader = as_user({"PATH": "/usr/bin:/bin"}, another_shell)
        assert os.waitstatus_to_exitcode(os.waitpid(reader, 0)[1]) == 0
        state, code, said = out.read_text().split("\n", 2)
        assert state == "running", said
        assert code == "0", said
        assert f"mgpu: stopping run {run_id} (supervisor pid {holder})" in said
        stopped = os.waitpid(holder, 0)[1]
        holder = None
        assert os.WIFSIGNALED(stopped) and os.WTERMSIG(stopped) == signal.SIGTERM
    finally:
        if holder is not None:
            os.kill(holder, signal.SIGKILL)
            os.waitpid(holder, 0)


@needs_root
def test_a_run_id_held_from_a_login_shell_is_refused_to_a_shell_without_its_runtime_dir(shared_dir, login_runtime):
    # A login shell's XDG_RUNTIME_DIR is /run/user/<uid>; a shell without one (cron, su) locks in /tmp.
    runtime = login_runtime
    run_id = f"taken-{os.getpid()}"
    go_read, go_write = os.pipe()  # the holder says through it that it holds the run id
    end_read, end_write = os.pipe()  # and waits on this one to end

    def holding() -> int:
        os.close(go_read)
        os.close(end_write)
        run_lock.claim_run_id(run_id)
        os.write(go_write, b"held")
        os.close(go_write)
        os.read(end_read, 1)  # until the test closes its end
        return 0

    holder = as_user({"XDG_RUNTIME_DIR": str(runtime)}, holding)
    os.close(go_write)
    os.close(end_read)
    try:
        with os.fdopen(go_read, "rb") as f:
            assert f.read() == b"held"
        answer = shared_dir / "answer"

        def claiming() -> int:
            try:
                run_lock.claim_run_id(run_id)
                answer.write_text(f"claimed in {run_lock.claim_folder(run_id)}")
            except UsageError as e:
                answer.write_text(str(e))
            return 0

        claimer = as_user({"PATH": "/usr/bin:/bin"}, claiming)
        assert os.waitstatus_to_exitcode(os.waitpid(claimer, 0)[1]) == 0
        assert answer.read_text() == (f"run id {run_id} is in use by running processes (pid {holder}: a launch on "
                                      f"this machine, in any log dir); choose another run id")
        assert not (pathlib.Path(f"/tmp/mgpu-{USER}") / f"{run_id}.lock").exists()  # its own lock given up
    finally:
        os.close(end_write)
        os.waitpid(holder, 0)
