import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from pid_reuse import start_with_pid
from launching import wait_for
from supervisor_helpers import make_plans, pid_alive, read_pids, records
from launcher.errors import TaskFailed
from launcher.backends.local import LocalBackend

pytestmark = pytest.mark.timeout(60)


def finish(proc, timeout=10.0):
    wait_for(lambda: proc.poll() is not None, timeout, what="the task to exit")
    proc.stdout.read()
    proc.stderr.read()
    proc.close()
    return proc.poll()


def test_env_workdir_attempt_and_own_session(run_id, record_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_TEST_BASE", "from-launcher")
    plan = make_plans(run_id, ["--record", str(record_dir)], workers=1, workdir=str(tmp_path),
                      env={"EXTRA": "x"})[0]
    proc = LocalBackend().start(plan, attempt=3)
    assert os.getsid(proc.pid) == proc.pid  # its own session: a terminal's Ctrl-C does not reach it
    assert finish(proc) == 0
    rec = records(record_dir)["worker-0.attempt3"]
    assert rec["cwd"] == str(tmp_path)
    env = rec["env"]
    assert env["MGPU_TEST_BASE"] == "from-launcher"
    assert env["EXTRA"] == "x"
    assert env["MGPU_ATTEMPT"] == "3"
    assert env["MGPU_RUN_ID"] == run_id
    assert json.loads(env["TF_CONFIG"]) == plan.tf_config


def test_signal_tree_reaches_grandchildren_that_left_the_session(run_id, record_dir):
    plan = make_plans(run_id, ["--record", str(record_dir), "--forever",
                               "--grandchild", "all", "--setsid-grandchild", "all"], workers=1)[0]
    proc = LocalBackend().start(plan, attempt=0)
    wait_for(lambda: len(read_pids(record_dir)) == 2, 10, what="2 sleeper pids")
    grandchildren = read_pids(record_dir)
    assert all(pid_alive(p) for p in grandchildren)
    proc.signal_tree(signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(p) for p in grandchildren), 5, what="the grandchildren to be gone")
    assert finish(proc) == -signal.SIGKILL


def test_signal_tree_after_exit_is_harmless(run_id):
    plan = make_plans(run_id, [], workers=1)[0]
    proc = LocalBackend().start(plan, attempt=0)
    assert finish(proc) == 0
    proc.signal_tree(signal.SIGTERM)


# Answers each line on stdin, so that a signal sent to it before is known to have
# arrived: pending signals are delivered before it can read and answer.
BYSTANDER = "import sys\nfor line in sys.stdin:\n    print('alive', flush=True)\n"


def test_signal_tree_after_reaping_spares_a_new_group_with_the_same_id(run_id):
    plan = make_plans(run_id, [], workers=1)[0]
    proc = LocalBackend().start(plan, attempt=0)
    assert finish(proc) == 0  # reaped, and its process group is empty
    bystander = start_with_pid(proc.pid, [sys.executable, "-c", BYSTANDER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert os.getpgid(bystander.pid) == proc.pid
        proc.signal_tree(signal.SIGTERM)
        bystander.stdin.write(b"still there?\n")
        bystander.stdin.flush()
        assert bystander.stdout.readline() == b"alive\n"
    finally:
        bystander.kill()
        bystander.wait()


def test_signal_tree_after_reaping_still_reaches_the_group_left_behind(run_id, record_dir):
    plan = make_plans(run_id, ["--record", str(record_dir), "--grandchild", "all"], workers=1)[0]
    proc = LocalBackend().start(plan, attempt=0)
    # The leader is reaped; its child stays in the group.
    wait_for(lambda: proc.poll() is not None, 10, what="the leader to exit")
    [grandchild] = read_pids(record_dir)
    assert os.getpgid(grandchild) == proc.pid
    proc.signal_tree(signal.SIGKILL)
    wait_for(lambda: not pid_alive(grandchild), 5, what="the grandchild to be gone")
    assert finish(proc) == 0


def test_close_ends_a_read_that_waits_on_a_pipe_held_by_another_process(run_id, record_dir):
    plan = make_plans(run_id, ["--record", str(record_dir), "--escaped-holder", "all"], workers=1)[0]
    proc = LocalBackend().start(plan, attempt=0)
    try:
        wait_for(lambda: proc.poll() is not None, 10, what="the leader to exit")
        [holder] = read_pids(record_dir, "*.escaped.pid")
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True)
        reader.start()
        reader.join(0.5)
        assert reader.is_alive()  # the holder keeps the pipe open: no end of file
        proc.close()
        reader.join(5)
        assert not reader.is_alive()
        assert lines == [b"worker:0 attempt 0 exiting with 0\n"]
        assert proc.stdout.closed and proc.stderr.closed
    finally:
        for pid in read_pids(record_dir, "*.escaped.pid"):
            os.kill(pid, signal.SIGKILL)


def test_missing_program_is_a_task_failure(run_id):
    plan = make_plans(run_id, [], workers=1)[0]
    plan = type(plan)(**{**plan.__dict__, "argv": ("/nonexistent/mgpu-test-program",)})
    with pytest.raises(TaskFailed, match="worker:0: cannot start '/nonexistent/mgpu-test-program'"):
        LocalBackend().start(plan, attempt=0)
