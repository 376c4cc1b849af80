import json
import os
import signal

import pytest

from supervisor_helpers import make_plans, pid_alive, read_pids, records, wait_for
from launcher.errors import TaskFailed
from launcher.runners.local import LocalRunner

pytestmark = pytest.mark.timeout(60)


def finish(proc, timeout=10.0):
    assert wait_for(lambda: proc.poll() is not None, timeout)
    proc.stdout.read()
    proc.stderr.read()
    proc.close()
    return proc.poll()


def test_env_workdir_attempt_and_own_session(run_id, record_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_TEST_BASE", "from-launcher")
    plan = make_plans(run_id, ["--record", str(record_dir)], workers=1, workdir=str(tmp_path),
                      env={"EXTRA": "x"})[0]
    proc = LocalRunner().start(plan, attempt=3)
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
    proc = LocalRunner().start(plan, attempt=0)
    assert wait_for(lambda: len(read_pids(record_dir)) == 2, 10)
    grandchildren = read_pids(record_dir)
    assert all(pid_alive(p) for p in grandchildren)
    proc.signal_tree(signal.SIGKILL)
    assert wait_for(lambda: not any(pid_alive(p) for p in grandchildren), 5)
    assert finish(proc) == -signal.SIGKILL


def test_signal_tree_after_exit_is_harmless(run_id):
    plan = make_plans(run_id, [], workers=1)[0]
    proc = LocalRunner().start(plan, attempt=0)
    assert finish(proc) == 0
    proc.signal_tree(signal.SIGTERM)


def test_missing_program_is_a_task_failure(run_id):
    plan = make_plans(run_id, [], workers=1)[0]
    plan = type(plan)(**{**plan.__dict__, "argv": ("/nonexistent/mgpu-test-program",)})
    with pytest.raises(TaskFailed, match="worker:0: cannot start '/nonexistent/mgpu-test-program'"):
        LocalRunner().start(plan, attempt=0)
