"""Programs of TensorFlow and Keras across two hosts in network namespaces: the built-in trainer,
Keras 3 on JAX, and a TensorFlow worker blocked in Python. Apart from test_netns.py and from
test_netns_torch.py (PyTorch and Lightning) so that test processes share them."""

from __future__ import annotations

import json
import pathlib
import socket

import pytest

import lab_mgpu
import needs
from launching import REPO
from ssh_helpers import PYTHON, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns]


@pytest.mark.slow
def test_two_hosts_run_the_trainer_on_the_same_port(netns, tmp_path):
    run_id = unique_run_id("netns")
    done = lab_mgpu.run(tmp_path, "launch", "--workers", "h1:2222,h2:2222", *lab_mgpu.ssh_files(netns), "--python",
                        PYTHON, "--workdir", str(tmp_path), "--run-id", run_id, "--env", f"PYTHONPATH={REPO}",
                        "--start-timeout", "120", "--", "--model", "small", "--dataset", "synthetic", "--threads", "1",
                        "--train-steps", "5", "--log-every", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # No warning, but for the speed probe's naming a host slow: both share this machine's busy cores.
    assert "checked 2 host(s)" in done.stderr
    assert not [line for line in done.stderr.splitlines() if "warning" in line and " is slow: " not in line]
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert record["status"] == "succeeded"
    assert [(p["name"], p["host"], p["port"]) for p in record["plans"]] == [("worker:0", "h1", 2222),
                                                                             ("worker:1", "h2", 2222)]
    # Two TensorFlow servers on one port only work on two hosts; the workers trained the same weights.
    done_line = next(line for line in (tmp_path / "mgpu-runs" / run_id / "worker-0.log").read_text().splitlines()
                     if line.startswith("done step=5"))
    fingerprints = done_line.split("fingerprints=")[1].split(",")
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    for index in (0, 1):
        assert "MGPU_TASK_READY" in (tmp_path / "mgpu-runs" / run_id / f"worker-{index}.log").read_text()
    assert not run_processes(run_id)


@pytest.mark.slow
def test_two_hosts_run_the_keras_jax_example(netns, tmp_path):
    """Keras 3 on the JAX backend across two hosts: h2 reaches the coordinator on h1:2222, and gloo
    connects the hosts. Gloo listens on the address the host's own name resolves to, so each host's
    hosts file names it, as a real host's must (docs/frameworks.md, Keras 3 programs)."""
    lab, *_ = netns
    hosts_files = {pathlib.Path(f"/etc/netns/{ns}/hosts"): name for name, ns in lab.namespaces.items()}
    originals = {path: path.read_text() for path in hosts_files}
    run_id = unique_run_id("netns-jax")
    try:
        for path, name in hosts_files.items():  # rewritten in place: the namespaces' mounts see it
            path.write_text(originals[path] + f"{lab.hosts[name]} {socket.gethostname()}\n")
        done = lab_mgpu.run(REPO, "launch", "--workers", "h1:2222,h2:2222", *lab_mgpu.ssh_files(netns), "--workdir",
                            str(tmp_path), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), "--", PYTHON,
                            str(REPO / "examples" / "keras_jax_fit.py"), "--epochs", "1",
                            "--steps-per-epoch", "2")
    finally:
        for path, text in originals.items():
            path.write_text(text)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = []
    for index in (0, 1):
        log = (tmp_path / "runs" / run_id / f"worker-{index}.log").read_text()
        results.append(json.loads(next(line for line in log.splitlines() if line.startswith("RESULT "))[7:]))
    assert [r["process_id"] for r in results] == [0, 1] and {r["num_processes"] for r in results} == {2}
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    assert not run_processes(run_id)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_remote_worker_blocked_in_python_is_named_with_its_stack(netns, tmp_path):
    needs.require("tensorflow")
    run_id = unique_run_id("netns-stall")
    # TensorFlow's silent start uses CPU, which counts as progress over SSH too: a short timeout will do.
    done = lab_mgpu.run(REPO, "launch", "--workers", "h1:2222,h2:2222", *lab_mgpu.ssh_files(netns), "--workdir",
                        str(tmp_path), "--run-id", run_id, "--no-check", "--log-dir", str(tmp_path / "runs"),
                        "--stall-timeout", "10", "--grace-period", "2", "--threads-per-task", "1", "--", PYTHON,
                        str(REPO / "tests" / "programs" / "mwms_stuck.py"), "1", "3")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines[0].startswith("mgpu: error: stall: no training task made progress for "), done.stderr
    assert lines[0].endswith("; likely cause: worker:1, in its own code while the others wait"), done.stderr
    assert "worker:0 on h1: waiting in tensorflow" in lines
    at = lines.index("worker:1 on h2: in its own code, not in a collective")
    assert any("mwms_stuck.py:" in line and line.endswith(" in next_batch") for line in lines[at:]), done.stderr
    assert not run_processes(run_id)
