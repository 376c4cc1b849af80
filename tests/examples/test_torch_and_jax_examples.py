"""examples/torch_ddp.py (PyTorch DDP, env://) and examples/jax_psum.py (plain JAX) under the real
`mgpu launch`: the variables mgpu sets are all they need, and a killed worker resumes from the snapshot."""

import os
import pathlib
import re
import secrets
import signal
import subprocess
import sys

import pytest

from launcher.host import proctree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = pathlib.Path(__file__).resolve().parents[2]


def mgpu_launch(tmp_path, launch_args, program):
    run_id = f"fw-{secrets.token_hex(4)}"
    argv = [sys.executable, "-m", "launcher", "launch", *launch_args, "--threads-per-task", "1",
            "--log-dir", str(tmp_path / "runs"), "--run-id", run_id,
            "--", sys.executable, *program]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
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
    proc, _ = launched(tmp_path, ["--local", "2", "--chief"], [str(REPO / "examples" / "jax_psum.py")])
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]
    # Processes 0, 1, 2 add 1 + 2 + 3; the chief is process 0.
    assert "[chief:0] process 0: psum 6 over 3 processes" in out, out[-3000:]
    assert "[worker:1] process 2: psum 6 over 3 processes" in out, out[-3000:]


def test_torch_ddp_trains_and_a_killed_worker_resumes_from_the_snapshot(tmp_path, launched):
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


def test_keras_3_on_torch_has_no_multi_process_distribution():
    """Keras 3 distributes `fit` across processes on JAX only: its torch backend has no distribution_lib."""
    import importlib.util

    import keras

    assert importlib.util.find_spec("keras.src.backend.jax.distribution_lib") is not None
    if importlib.util.find_spec("keras.src.backend.torch.distribution_lib") is not None:
        pytest.fail(f"Keras {keras.__version__} has a torch distribution_lib: add a Keras-on-torch fit test")
    pytest.skip(f"Keras {keras.__version__}'s torch backend has no multi-process distribution (no distribution_lib)")
