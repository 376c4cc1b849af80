"""Supervision for the whole run, with real frameworks under the real `mgpu launch`: JAX and PyTorch
jobs (only process 0 listens) are seen ready while they run, and a TensorFlow job whose worker blocks
in Python is stopped by the stall watchdog, which names that worker and shows its stack."""

import json
import secrets
import sys

import pytest
from needs import installed_version

from launcher.host import proctree
from launching import REPO, start_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAMS = REPO / "tests" / "programs"


def launch(tmp_path, launch_args, program, *program_args, timeout=240, until_ready=False):
    """`mgpu launch --local 2 ... -- python PROGRAM ARGS`: (exit code, stdout, stderr, run.json).

    With `until_ready`, PROGRAM runs until the file tmp_path/"hold-over" exists (its last argument),
    which is made once mgpu has said that every task is ready."""
    run_id = f"whole-{secrets.token_hex(4)}"
    hold_over = tmp_path / "hold-over"
    if until_ready:
        program_args = (*program_args, str(hold_over))
    argv = ["launch", "--local", "2", "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"),
            "--run-id", run_id, *launch_args, "--", sys.executable, str(PROGRAMS / program), *program_args]
    err_path = tmp_path / "mgpu.err"  # a file: a full stderr pipe cannot stall mgpu while stdout is read
    with open(err_path, "w") as err_file:
        proc = start_mgpu(*argv, cwd=tmp_path, stderr=err_file)
    try:
        seen = []
        if until_ready:
            for line in proc.stdout:  # ends when mgpu does: the wait is for an event
                seen.append(line)
                if line.startswith("[mgpu] all 2 tasks ready after"):
                    hold_over.touch()
                    break
        out, _ = proc.communicate(timeout=timeout)
        out = "".join(seen) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        left = proctree.tagged_processes(run_id)
        proctree.send(left, 9)
    assert not left, f"left running: {[p.pid for p in left]}"
    record = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
    return proc.returncode, out, err_path.read_text(), record


def assert_ready_while_running(out: str, record: dict, last_line: str) -> None:
    lines = out.splitlines()
    ready = [i for i, line in enumerate(lines) if line.startswith("[mgpu] all 2 tasks ready after")]
    finished = [i for i, line in enumerate(lines) if last_line in line]
    assert ready and finished and ready[0] < min(finished), out[-3000:]
    for task in record["attempts"][0]["tasks"].values():
        assert task["ready_at"] and task["ready_at"] < task["ended_at"], task


# The programs run until every task is seen ready (only process 0 listens; the others are seen
# joining by their connections to it), then end: a start timeout far past any join keeps a slow
# machine from failing them. That a ready job then runs past the start timeout is the subject of
# tests/supervise/test_supervise_start.py's fake-worker test.

def test_a_jax_job_is_seen_ready_while_it_runs(tmp_path):
    installed_version("jax")
    code, out, err, record = launch(tmp_path, ["--start-timeout", "120"], "jax_psum.py", until_ready=True)
    assert code == 0, out[-3000:] + err[-3000:]
    assert_ready_while_running(out, record, "psum 2 after")


def test_a_pytorch_ddp_job_is_seen_ready_while_it_runs(tmp_path):
    installed_version("torch")
    code, out, err, record = launch(tmp_path, ["--start-timeout", "120"], "torch_ddp.py", until_ready=True)
    assert code == 0, out[-3000:] + err[-3000:]
    assert_ready_while_running(out, record, "steps, loss")


def test_a_worker_blocked_in_python_is_named_with_its_stack(tmp_path):
    installed_version("tensorflow", "the train extra")
    code, out, err, record = launch(tmp_path, ["--stall-timeout", "10", "--grace-period", "2"], "mwms_stuck.py", "1", "3")
    assert code == 1, out[-3000:] + err[-3000:]
    lines = err.splitlines()
    assert lines[0].startswith("mgpu: error: stall: no training task made progress for "), err
    assert lines[0].endswith("; likely cause: worker:1, in its own code while the others wait"), err
    assert "worker:0 on 127.0.0.1: waiting in tensorflow" in lines
    at = lines.index("worker:1 on 127.0.0.1: in its own code, not in a collective")
    assert any("mwms_stuck.py:" in line and line.endswith(" in next_batch") for line in lines[at:]), err
    assert record["status"] == "stalled"
    stacks = (tmp_path / "runs" / record["run_id"] / "stacks-0.txt").read_text()
    assert "===== worker:1 on 127.0.0.1 =====" in stacks and "in next_batch" in stacks
