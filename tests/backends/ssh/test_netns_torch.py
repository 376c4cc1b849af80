"""PyTorch programs across two hosts in network namespaces: DDP on Gloo, on the interface that joins
the hosts, and Lightning with two processes on each host. Apart from test_netns_frameworks.py
(TensorFlow and Keras) so that two test processes share them."""

from __future__ import annotations

import pathlib

import pytest

import lab_mgpu
import needs
from launching import REPO
from ssh_helpers import PYTHON, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns]


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


def _interfaces_on_two_hosts(netns, tmp_path, *options, program=()):
    """Launch on h1 and h2, each task showing the interfaces it was given before it runs `program`
    (none: the line alone); each task's log, after the interfaces both were given are checked."""
    run_id = unique_run_id("netns-torch")
    shown = 'echo "interfaces: $NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME"' + (' && exec "$0" "$@"' if program else "")
    done = lab_mgpu.run(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "h1:2222,h2:2222", *options,
                        "--workdir", str(tmp_path), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), "--", "sh",
                        "-c", shown, *program)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logs = [(tmp_path / "runs" / run_id / f"worker-{index}.log").read_text() for index in (0, 1)]
    for log in logs:
        assert "interfaces: =eth0 eth0" in log.splitlines()
    assert not run_processes(run_id)
    return logs


@pytest.mark.slow
def test_pytorch_on_two_hosts_with_two_interfaces_uses_the_one_that_joins_them(netns, tmp_path):
    """Each host has mgmt0 first and eth0, and only eth0 joins the hosts. The preflight finds eth0 on
    each (it holds the address the other tasks dial) and gives it to Gloo and NCCL; left to itself,
    Gloo listens on the address the host's name resolves to, which no peer reaches here."""
    needs.require("torch")
    program = str(REPO / "tests" / "programs" / "torch_ddp.py")
    for index, log in enumerate(_interfaces_on_two_hosts(netns, tmp_path, program=(PYTHON, program, "1"))):
        assert f"rank {index}: " in log


@pytest.mark.slow
def test_a_host_whose_own_name_is_loopback_there_still_gets_the_interface_its_peers_dial(
        netns, own_name_on_loopback, tmp_path):
    """The address that counts is the one the *other* hosts dial: on h1 itself, h1 is 127.0.1.1.
    The interfaces each task is given are the promise; that Gloo joins the hosts on the one given
    is the test above's."""
    _interfaces_on_two_hosts(netns, tmp_path, "--keep-host-names")


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
