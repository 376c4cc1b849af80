"""Failure summaries of real TensorFlow programs under `mgpu launch`: the exception and the user's
frame instead of TensorFlow's start-up noise, and one hint line per known failure."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from needs import installed_version

from launching import REPO, run_mgpu, start_mgpu
from launcher.supervise import diagnosis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
installed_version("tensorflow", "the train extra")

PROLOGUE = "import json, os, socket, sys, time\nimport tensorflow as tf\n"
SHORT_HEARTBEAT_TRAINER = REPO / "tests" / "programs" / "short_heartbeat_trainer.py"
HEARTBEAT_MS = 2000


def launch(tmp_path, program: str, *args: str, workers: int = 2) -> tuple[int, str, str]:
    """Run `program` in every task of a local cluster; (exit code, stdout, stderr) of mgpu."""
    path = tmp_path / "prog.py"
    path.write_text(PROLOGUE + textwrap.dedent(program))
    done = run_mgpu("launch", "--local", str(workers), "--log-dir", str(tmp_path / "runs"), "--grace-period", "2",
                    *args, "--", sys.executable, str(path), cwd=tmp_path, timeout=150)
    return done.returncode, done.stdout, done.stderr


def hint_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hint: ")]


def test_a_python_exception_is_summarised_by_its_type_message_and_frame(tmp_path):
    code, _, err = launch(tmp_path, """
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        def load_shard():
            raise ValueError("shard 7 is missing")
        load_shard()
    """, workers=1)
    assert code == 1
    summary = err[err.index("mgpu: error: "):].splitlines()
    assert summary[0].startswith("mgpu: error: worker:") and summary[0].endswith(" exited with code 1")
    assert summary[1] == "  ValueError: shard 7 is missing"
    assert summary[2] == f"  at {tmp_path / 'prog.py'}:6 in load_shard: raise ValueError(\"shard 7 is missing\")"
    assert summary[3].startswith("log: ") and summary[3].endswith(".log")
    assert len(summary) == 4
    # The noise is gone from the summary only: the log keeps every line TensorFlow printed.
    log = open(summary[3][len("log: "):]).read().splitlines()
    assert any(diagnosis.is_noise(line) and line.strip() for line in log)
    assert "Traceback (most recent call last):" in log


def test_a_port_taken_by_another_process_gets_the_hint(tmp_path):
    # The program itself holds its task's port before TensorFlow's server tries to bind it.
    code, _, err = launch(tmp_path, """
        config = json.loads(os.environ["TF_CONFIG"])
        me = config["cluster"]["worker"][config["task"]["index"]]
        holder = socket.socket()
        holder.bind(("0.0.0.0", int(me.rsplit(":", 1)[1])))
        holder.listen()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    """, workers=1)
    assert code == 1
    assert "mgpu: error: worker:0 on 127.0.0.1 exited with code 1: port in use: 127.0.0.1:" in err
    [hint] = hint_lines(err)
    assert hint.startswith("hint: another process holds the task's port")


def test_a_peer_that_is_gone_gets_the_unreachable_hint(tmp_path):
    # worker:0 hosts the coordination service and leaves; worker:1's next collective cannot reach it.
    code, _, err = launch(tmp_path, """
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
            os._exit(0)
        time.sleep(2)
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    """)
    assert code == 1
    assert "mgpu: error: worker:1 on 127.0.0.1 exited with code 1" in err
    assert "UnavailableError" in err
    [hint] = hint_lines(err)
    assert hint.startswith("hint: a task could not reach another") and "mgpu check" in hint


def test_restoring_a_checkpoint_that_is_not_there_yet_gets_the_hint(tmp_path):
    # What an evaluator started with the workers meets when it reads before the first save.
    code, _, err = launch(tmp_path, """
        checkpoint = tf.train.Checkpoint(step=tf.Variable(0))
        checkpoint.read(os.path.join(os.getcwd(), "model", "ckpt-1")).assert_consumed()
    """, workers=1)
    assert code == 1
    assert "NotFoundError" in err
    [hint] = hint_lines(err)
    assert hint.startswith("hint: no checkpoint there yet") and "checkpoints_iterator" in hint


def launch_trainer(tmp_path, run_id: str, *trainer_args: str, workers: int = 2) -> subprocess.Popen:
    """`mgpu launch --local N` of the built-in trainer (or the program `trainer_args` begin with), its
    stderr going to tmp_path/stderr.txt; the caller reads its stdout and waits for it."""
    with open(tmp_path / "stderr.txt", "w") as stderr:
        return start_mgpu("launch", "--local", str(workers), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                          "--grace-period", "2", "--", *trainer_args, cwd=tmp_path, stderr=stderr)


def test_the_trainers_error_file_is_what_the_summary_shows(tmp_path):
    empty = tmp_path / "no-data"
    empty.mkdir()
    proc = launch_trainer(tmp_path, "no-data", "--dataset", "fashion_mnist", "--data-dir", str(empty), workers=1)
    proc.communicate(timeout=120)
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 1
    summary = err[err.index("mgpu: error: "):].splitlines()
    assert summary[0] == "mgpu: error: worker:0 on 127.0.0.1 exited with code 1"
    # The error file's message, not the trainer's stderr line ("mgpu train: error: ...").
    assert summary[1].startswith(f"  {empty} lacks train-images-idx3-ubyte")
    written = json.loads((tmp_path / "runs" / "no-data" / "worker-0.attempt0.error.json").read_text())
    assert written["exception"] == "DatasetError" and written["exit"] == "error"
    assert written["message"] == summary[1].strip() and "Traceback (most recent call last):" in written["traceback"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("frozen_task, reporter, head", [
    ("worker:1", "worker:0", "worker:1 on 127.0.0.1 stopped sending heartbeats (reported by worker:0, which exited "
                             "with code 1)"),
    ("worker:0", "worker:1", "worker:0 on 127.0.0.1 stopped answering heartbeats (it runs TensorFlow's coordination "
                             "service; reported by worker:1, which exited with code 1)"),
])
def test_a_frozen_worker_is_named_as_the_task_at_fault(tmp_path, frozen_task, reporter, head):
    # A worker is stopped (SIGSTOP) mid-training; TensorFlow makes the other fail for it. The
    # summary names the frozen one, and sends the user to it, not to firewalls.
    import queue
    import signal
    import threading

    run_id = f"frozen-{frozen_task.replace(':', '-')}"  # each case its own: nothing of one holds the other's id
    # TensorFlow gives up on a silent task after HEARTBEAT_MS here, not its default 10 s: the same words, sooner.
    proc = launch_trainer(tmp_path, run_id, sys.executable, str(SHORT_HEARTBEAT_TRAINER), str(HEARTBEAT_MS),
                          "--model", "small", "--dataset", "synthetic", "--threads", "1",
                          "--train-steps", "1000000", "--log-every", "5")
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*(lines.put(line) for line in proc.stdout), lines.put(None)], daemon=True).start()
    frozen = None
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until worker:0 trains, so worker:1 does too (the steps are in step)
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                continue  # the deadline: the loop ends
            if line is None:
                pytest.fail("mgpu ended before worker:0 trained: " + (tmp_path / "stderr.txt").read_text()[-3000:])
            if line.startswith("[worker:0] train step="):
                break
        else:
            pytest.fail("worker:0 never reported a training step")
        run = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
        frozen = run["attempts"][0]["tasks"][frozen_task]["pid"]
        os.kill(frozen, signal.SIGSTOP)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 1
    err = (tmp_path / "stderr.txt").read_text()
    summary = err[err.index("mgpu: error: "):].splitlines()
    assert summary[0] == f"mgpu: error: {head}"
    # What the other reported: TensorFlow's line that says why, not the "Graph execution error:" heading.
    assert summary[1] == f"{reporter} reported:"
    assert summary[2].startswith(f"  {reporter}: TensorFlow ") and "Graph execution error" not in summary[2]
    [hint] = hint_lines(err)
    assert hint.startswith("hint: a task stopped sending or answering heartbeats") and "firewall" not in hint
    logs = tmp_path / "runs" / run_id
    assert summary[-2:] == [f"log: {logs / (frozen_task.replace(':', '-') + '.log')}",
                            f"log: {logs / (reporter.replace(':', '-') + '.log')}"]
    if frozen_task == "worker:1":  # the error file keeps TensorFlow's whole message, which names it too
        written = json.loads((logs / "worker-0.attempt0.error.json").read_text())
        assert written["exit"] == "error" and "/job:worker/replica:0/task:1" in written["traceback"]
