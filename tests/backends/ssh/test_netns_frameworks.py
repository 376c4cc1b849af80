"""Programs of each framework across two hosts in network namespaces: the built-in trainer,
PyTorch (Gloo, on the interface that joins the hosts), Lightning, Keras 3 on JAX, and a TensorFlow
worker blocked in Python. Apart from test_netns.py so that two test processes share them."""

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


@pytest.fixture
def own_name_on_loopback(netns):
    """h1 resolves its own name to 127.0.1.1, as Debian's /etc/hosts has it, while every other host
    resolves it to h1's address."""
    lab, *_ = netns
    path = pathlib.Path(f"/etc/netns/{lab.namespaces['h1']}/hosts")
    original = path.read_text()
    path.write_text("127.0.1.1 h1\n" + original)  # rewritten in place: the namespace's mount sees it
    try:
        yield
    finally:
        path.write_text(original)


def _torch_on_two_hosts(netns, tmp_path, *options):
    run_id = unique_run_id("netns-torch")
    program = str(REPO / "tests" / "programs" / "torch_ddp.py")
    shown = 'echo "interfaces: $NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME"; exec "$0" "$@"'
    done = lab_mgpu.run(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "h1:2222,h2:2222", *options,
                        "--workdir", str(tmp_path), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), "--", "sh",
                        "-c", shown, PYTHON, program, "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for index in (0, 1):
        log = (tmp_path / "runs" / run_id / f"worker-{index}.log").read_text()
        assert "interfaces: =eth0 eth0" in log.splitlines()
        assert f"rank {index}: " in log
    assert not run_processes(run_id)


@pytest.mark.slow
def test_pytorch_on_two_hosts_with_two_interfaces_uses_the_one_that_joins_them(netns, tmp_path):
    """Each host has mgmt0 first and eth0, and only eth0 joins the hosts. The preflight finds eth0 on
    each (it holds the address the other tasks dial) and gives it to Gloo and NCCL; left to itself,
    Gloo listens on the address the host's name resolves to, which no peer reaches here."""
    needs.require("torch")
    _torch_on_two_hosts(netns, tmp_path)


@pytest.mark.slow
def test_a_host_whose_own_name_is_loopback_there_still_gets_the_interface_its_peers_dial(
        netns, own_name_on_loopback, tmp_path):
    """The address that counts is the one the *other* hosts dial: on h1 itself, h1 is 127.0.1.1."""
    needs.require("torch")
    _torch_on_two_hosts(netns, tmp_path, "--keep-host-names")


def _lightning_on_two_hosts(netns, tmp_path, hosts, devices):
    """Lightning's Trainer (strategy="ddp", CPU) with `devices` processes on each of h1 and h2: every
    process knows its node and its rank from torchrun's contract, and DDP ends them with equal weights."""
    needs.require("lightning")
    run_id = unique_run_id("netns-lightning")
    program = str(REPO / "tests" / "programs" / "lightning_ddp.py")
    done = lab_mgpu.run(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--hosts", hosts, "--workdir", str(tmp_path),
                        "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), "--start-timeout", "200", "--", PYTHON,
                        program, str(devices), "2", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    world = 2 * devices
    found = {}
    for index in range(world):
        log = (tmp_path / "runs" / run_id / f"worker-{index}.log").read_text()
        [line] = [line for line in log.splitlines() if line.startswith("lightning rank ")]
        place, weights = line.split(": weights sum ")
        found[place] = weights
    assert sorted(found) == sorted(f"lightning rank {rank} of {world}, node {rank // devices}, "
                                   f"local rank {rank % devices}" for rank in range(world)), found
    assert len(set(found.values())) == 1, found  # DDP kept every replica equal
    assert not run_processes(run_id)


@pytest.mark.slow
def test_lightning_with_two_processes_on_each_of_two_hosts(netns, tmp_path):
    """Trainer(devices=2, num_nodes=2): Lightning takes each host's node rank from GROUP_RANK (without
    it both hosts are node 0) and each process's local rank from LOCAL_RANK."""
    _lightning_on_two_hosts(netns, tmp_path, "h1:2,h2:2", devices=2)


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
                            str(REPO / "examples" / "keras_jax_fit.py"), "--epochs", "1")
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
