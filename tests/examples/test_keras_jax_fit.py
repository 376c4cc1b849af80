"""examples/keras_jax_fit.py, a Keras 3 `fit` on the JAX backend, under the real `mgpu launch`:
one job across the tasks with equal weights at the end, fail-fast and restarts."""

import json
import os
import secrets
import signal
import sys

import pytest
from needs import installed_version, stand_in

from launcher.host import proctree
from launching import REPO, finish, mgpu_env, per_attempt, start_mgpu, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
installed_version("keras")
installed_version("jax")

EXAMPLE = [sys.executable, str(REPO / "examples" / "keras_jax_fit.py")]


class Launch:
    """`mgpu launch ... -- python examples/keras_jax_fit.py ...` as a subprocess."""

    def __init__(self, tmp_path, name, launch_args, example_args=(), epochs_per_attempt=None, env=None):
        run_id = f"{name}-{secrets.token_hex(4)}"  # unique on this machine: processes are found by it
        self.run_dir = tmp_path / "runs" / run_id
        self.run_id = run_id
        program = [*EXAMPLE, *example_args]
        if epochs_per_attempt:  # (the first attempt's, the later ones')
            program = per_attempt(program, "--epochs", *epochs_per_attempt)
        self.proc = start_mgpu("launch", *launch_args, "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"),
                               "--run-id", run_id, "--", *program, cwd=tmp_path, env=env)

    def finish(self, timeout=240):
        return finish(self.proc, timeout)

    def record(self):
        return json.loads((self.run_dir / "run.json").read_text())

    def log(self, task):
        path = self.run_dir / f"{task.replace(':', '-')}.log"
        return path.read_text() if path.exists() else ""

    def results(self, tasks):
        """The RESULT line each task printed last."""
        found = {}
        for task in tasks:
            lines = [line for line in self.log(task).splitlines() if line.startswith("RESULT ")]
            assert lines, f"{task} printed no RESULT:\n{self.log(task)[-3000:]}"
            found[task] = json.loads(lines[-1][len("RESULT "):])
        return found

    def wait_for_log(self, task, text, timeout=180):
        def logged():
            if text in self.log(task):
                return True
            assert self.proc.poll() is None, f"{task} never logged {text!r}: the run ended"
            return False

        wait_for(logged, timeout, what=f"{task} to log {text!r}", interval=0.1)

    def task_pid(self, task, attempt=0):
        return self.record()["attempts"][attempt]["tasks"][task]["pid"]

    def close(self):
        """After a failed test: the launcher and every task of the run, without waiting out a grace period."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for process in proctree.tagged_processes(self.run_id):
            process.kill()


@pytest.fixture
def launches():
    started = []
    yield lambda *args, **kwargs: started.append(Launch(*args, **kwargs)) or started[-1]
    for launch in started:
        launch.close()


def assert_one_job_with_equal_weights(results, processes):
    assert sorted(r["process_id"] for r in results.values()) == list(range(processes))
    assert {r["num_processes"] for r in results.values()} == {processes}
    assert len({r["weights_sha256"] for r in results.values()}) == 1, results
    assert len({r["loss"] for r in results.values()}) == 1, results


def test_with_a_chief_the_chief_is_process_0_and_no_task_imports_tensorflow(tmp_path, launches):
    """Keras seeds TensorFlow as well whenever it is importable, and initialize() seeds: the example
    keeps it out. Here the TensorFlow each task would find is a stand-in that leaves a file."""
    tensorflow_loaded = tmp_path / "tensorflow-loaded"
    stand_ins = stand_in(tmp_path, "tensorflow", tensorflow_loaded, importable=False)
    env = mgpu_env(PYTHONPATH=os.pathsep.join([stand_ins, str(REPO)]))
    launch = launches(tmp_path, "chief", ["--local", "1", "--chief"], env=env)
    code, out = launch.finish()
    assert code == 0, out[-3000:]
    results = launch.results(["chief:0", "worker:0"])
    assert_one_job_with_equal_weights(results, 2)
    assert results["chief:0"]["process_id"] == 0 and results["worker:0"]["process_id"] == 1
    assert not tensorflow_loaded.exists(), "a task imported tensorflow"


def test_a_killed_worker_ends_the_attempt_and_restarts_the_job_which_then_trains_to_equal_weights_seen_ready_first(
        tmp_path, launches):
    # 30 epochs in the first attempt, which cannot end before the kill; 2 in the job formed again.
    # A start timeout far past any join: a slow machine does not fail it. A grace period longer than
    # the restart takes: the other task, waiting on its dead peer, must end on SIGTERM alone.
    launch = launches(tmp_path, "restarted", ["--local", "2", "--max-restarts", "1", "--grace-period", "60",
                                              "--start-timeout", "120"], epochs_per_attempt=(30, 2))
    launch.wait_for_log("worker:0", "Epoch 2/")
    assert launch.proc.poll() is None, "the run ended before worker:1 could be killed"
    os.kill(launch.task_pid("worker:1"), signal.SIGKILL)
    code, out = launch.finish()
    assert code == 0, out[-3000:]
    assert "[mgpu] worker:1 was killed by SIGKILL; stopping all tasks" in out and "grace period over" not in out, out[-3000:]
    attempts = launch.record()["attempts"]
    assert len(attempts) == 2 and launch.record()["status"] == "succeeded"
    # The second attempt formed the job again, on the same coordinator address, and finished it.
    results = launch.results(["worker:0", "worker:1"])
    assert_one_job_with_equal_weights(results, 2)
    assert results["worker:0"]["process_id"] == 0  # worker 0 coordinates when there is no chief
    assert results["worker:0"]["accuracy"] > 0.5  # it learned: the synthetic set is learnable
    # Only process 0 listens; process 1 is seen joining by its connection to it (no ready line),
    # before the job's first epoch.
    lines = out.splitlines()
    restart = next(i for i, line in enumerate(lines) if "restarting all tasks" in line)
    first_epoch = next(i for i, line in enumerate(lines) if "Epoch 1/2" in line)
    assert any(line.startswith("[mgpu] all 2 tasks ready after") for line in lines[restart:first_epoch]), out[-3000:]
    assert all(task["ready_at"] for task in attempts[1]["tasks"].values())
    assert not proctree.tagged_processes(launch.run_id)
