"""examples/torch_ddp.py (PyTorch DDP, env://) and examples/jax_psum.py (plain JAX) under the real
`mgpu launch`: the variables mgpu sets are all they need, and a killed worker resumes from the snapshot."""

import os
import re
import secrets
import signal
import subprocess
import sys

import pytest
from needs import installed_version

from launcher.supervise.fixes import FIXES, hints
from launcher.host import proctree
from launcher.supervise import diagnosis
from launching import REPO, start_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def mgpu_launch(tmp_path, launch_args, program):
    run_id = f"fw-{secrets.token_hex(4)}"
    proc = start_mgpu("launch", *launch_args, "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"),
                      "--run-id", run_id, "--", sys.executable, *program, cwd=tmp_path)
    return proc, run_id


@pytest.fixture
def launched():
    started = []
    yield lambda *args: started.append(mgpu_launch(*args)) or started[-1]
    for proc, run_id in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        for process in proctree.tagged_processes(run_id):
            process.kill()


def test_jax_psum_joins_one_job_from_mgpus_variables(tmp_path, launched):
    installed_version("jax")
    proc, _ = launched(tmp_path, ["--local", "2", "--chief"], [str(REPO / "examples" / "jax_psum.py")])
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]
    # Processes 0, 1, 2 add 1 + 2 + 3; the chief is process 0.
    assert "[chief:0] process 0: psum 6 over 3 processes" in out, out[-3000:]
    assert "[worker:1] process 2: psum 6 over 3 processes" in out, out[-3000:]


def test_torch_ddp_trains_and_a_killed_worker_resumes_from_the_snapshot(tmp_path, launched):
    installed_version("torch")
    program = [str(REPO / "examples" / "torch_ddp.py"), "--epochs", "40", "--save-every", "2",
               "--snapshot", str(tmp_path / "snapshot.pt")]
    proc, run_id = launched(tmp_path, ["--local", "2", "--max-restarts", "1", "--grace-period", "60"], program)
    lines, pid = [], None
    for line in proc.stdout:  # ends when mgpu does: every wait here is for an event
        lines.append(line)
        match = re.match(r"\[worker:1\] \[RANK1\] joined: rank 1 of 2, local rank 1, pid (\d+)", line)
        if match:
            pid = int(match.group(1))
        if line.startswith("[worker:0] [RANK0] Epoch 2 | Training snapshot saved"):
            break
    assert pid is not None and proc.poll() is None, "".join(lines[-50:])
    os.kill(pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=240)
    out = "".join(lines) + rest
    assert proc.returncode == 0, out[-3000:]
    assert "[mgpu] worker:1 was killed by SIGKILL" in out and "restarting all tasks (restart 1 of 1)" in out, out[-3000:]
    resumed = [int(epoch) for epoch in re.findall(r"\[worker:1\] \[RANK1\] Resuming training from snapshot at Epoch (\d+)", out)]
    assert len(resumed) == 1 and resumed[0] >= 3, out[-3000:]  # the snapshot after epoch 2, or a later one
    done = re.findall(r"\[(worker:\d)\] \[RANK\d\] done: epochs 40, loss \S+, weights sum (\S+)", out)
    assert sorted(task for task, _ in done) == ["worker:0", "worker:1"], out[-3000:]
    assert len({weights for _, weights in done}) == 1  # DDP kept the replicas equal
    assert not proctree.tagged_processes(run_id)


def test_keras_3_on_torch_has_no_multi_process_distribution(tmp_path):
    """Keras 3 distributes `fit` across processes on JAX only: on its torch backend,
    keras.distribution.initialize() has no distribution library to call, even with the variables
    mgpu sets. So mgpu's hint for Keras 3 `fit` names the JAX backend, and docs/frameworks.md says
    Keras on torch is not supported; when this test fails, Keras has changed: add a Keras-on-torch
    `fit` test and update both."""
    installed_version("keras")
    installed_version("torch")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("KERAS_", "JAX_"))}
    env.update(KERAS_BACKEND="torch", KERAS_HOME=str(tmp_path), KERAS_DISTRIBUTION_JOB_ADDRESSES="127.0.0.1:1",
               KERAS_DISTRIBUTION_NUM_PROCESSES="1", KERAS_DISTRIBUTION_PROCESS_ID="0")
    done = subprocess.run([sys.executable, "-c", "import keras; keras.distribution.initialize()"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, f"Keras on torch now initializes a distribution:\n{done.stdout}{done.stderr}"
    assert done.stderr.splitlines()[-1] == "AttributeError: 'NoneType' object has no attribute 'initialize'", \
        done.stderr[-3000:]
    hint = FIXES[diagnosis.KERAS3_FIT_UNDER_MWMS]
    assert "KERAS_BACKEND=jax" in hint and "torch" not in hint
    # What the program printed gets the hint for Keras on torch, and that one alone.
    assert hints(done.stderr.splitlines()) == [f"hint: {FIXES[diagnosis.KERAS3_TORCH_NO_DISTRIBUTION]}"]
