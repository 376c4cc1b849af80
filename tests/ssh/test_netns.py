"""Two hosts in network namespaces of our own, each with its own sshd; the launcher stays in the
root namespace and reaches them over a veth and a bridge. Nothing leaves these namespaces."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess

import pytest

from launcher.plan.planner import TaskPlan
from launcher.runners.ssh.runner import SshRunner
from launcher.config.spec import SshSettings
from ssh_helpers import (NETNS_PREFIX, PYTHON, REPO, REQUIRE, Netns, SshLab, ip, remove_namespace,
                         remove_stale_namespaces, require_tools, run_processes, start_sshd, unique_run_id)

pytestmark = [pytest.mark.ssh, pytest.mark.netns]


def require_namespaces() -> None:
    require_tools("ip")
    if os.geteuid() != 0:
        reason = "network namespaces need root"
        if REQUIRE:
            pytest.fail(reason + " and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def netns(ssh_lab: SshLab, tmp_path_factory):
    require_namespaces()
    directory = tmp_path_factory.mktemp("netns")
    lab = Netns.create()
    servers = []
    try:
        for name, address in lab.hosts.items():
            servers.append(start_sshd(directory, name, ssh_lab.authorized_keys, address=address, port=22,
                                      netns=lab.namespaces[name]))
        # A host only h1 can reach: an sshd on the loopback of h1's namespace.
        inner = start_sshd(directory, "inner", ssh_lab.authorized_keys, address="127.0.0.1", port=22,
                           netns=lab.namespaces["h1"])
        servers.append(inner)
        known = directory / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in servers))
        config = directory / "ssh_config"
        config.write_text(
            "".join(f"Host {n}\n  HostName {a}\n  IdentityFile {ssh_lab.client_key}\n" for n, a in lab.hosts.items())
            + f"Host inner\n  HostName 127.0.0.1\n  ProxyJump h1\n  IdentityFile {ssh_lab.client_key}\n"
            + f"Host *\n  User {ssh_lab.user}\n"
        )
        yield lab, known, config, directory
    finally:
        for server in servers:
            server.stop()
        lab.destroy()
        assert not any(ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                       for ns in lab.namespaces.values())


def test_proxy_jump_reaches_a_host_only_the_jump_host_sees(netns):
    lab, known, config, _ = netns
    from launcher.runners.ssh.options import SshOptions

    runner = SshRunner(SshOptions(known_hosts=str(known), ssh_config=str(config), connect_timeout=5))
    plan = TaskPlan("worker", 0, "inner", 2222, False, SshSettings(), ("true",), {"TF_CONFIG": "{}"}, None, False)
    try:
        code, out, _ = runner.run(plan, "readlink /proc/self/ns/net", 10)
    finally:
        runner.close()
    assert code == 0 and out.decode().strip() == f"net:[{lab.net_inode('h1')}]"


@pytest.mark.slow
def test_two_hosts_run_the_trainer_on_the_same_port(netns, tmp_path):
    lab, known, config, _ = netns
    run_id = unique_run_id("netns")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    done = subprocess.run(
        [PYTHON, "-m", "launcher", "launch", "--workers", "h1:2222,h2:2222", "--ssh-config", str(config),
         "--known-hosts", str(known), "--python", PYTHON, "--workdir", str(tmp_path), "--run-id", run_id,
         "--env", f"PYTHONPATH={REPO}", "--start-timeout", "120",
         "--", "--model", "small", "--dataset", "synthetic", "--threads", "1", "--train-steps", "5", "--log-every", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checked 2 host(s)" in done.stderr and "warning" not in done.stderr
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
    hosts file names it, as a real host's must (README, Keras 3 programs)."""
    lab, known, config, _ = netns
    hosts_files = {pathlib.Path(f"/etc/netns/{ns}/hosts"): name for name, ns in lab.namespaces.items()}
    originals = {path: path.read_text() for path in hosts_files}
    run_id = unique_run_id("netns-jax")
    env = {**os.environ}
    env.pop("SSH_AUTH_SOCK", None)
    try:
        for path, name in hosts_files.items():  # rewritten in place: the namespaces' mounts see it
            path.write_text(originals[path] + f"{lab.hosts[name]} {socket.gethostname()}\n")
        done = subprocess.run(
            [PYTHON, "-m", "launcher", "launch", "--workers", "h1:2222,h2:2222", "--ssh-config", str(config),
             "--known-hosts", str(known), "--workdir", str(tmp_path), "--run-id", run_id,
             "--log-dir", str(tmp_path / "runs"), "--", PYTHON, str(REPO / "examples" / "keras_jax_fit.py"),
             "--epochs", "1"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
        )
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


PUBLIC_ADDRESS = "1.2.3.4"  # a global unicast address, only ever used inside the namespace below


@pytest.fixture
def public_netns():
    """A namespace of our own whose only interface, lo, also has a public address: this
    machine as a host on the internet, with nothing routed anywhere."""
    require_namespaces()
    remove_stale_namespaces()
    name = f"{NETNS_PREFIX}{os.getpid()}-pub"
    try:
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{PUBLIC_ADDRESS}/32", "dev", "lo")
        yield name
    finally:
        remove_namespace(name)


def test_a_local_task_on_a_public_address_is_warned_about(public_netns, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for extra, warned in (([], True), (["--allow-public"], False)):
        run_id = unique_run_id("public")
        done = subprocess.run(
            ["ip", "netns", "exec", public_netns, PYTHON, "-m", "launcher", "launch", "--workers",
             f"{PUBLIC_ADDRESS}:2222", "--run-id", run_id, *extra, "--", PYTHON, "-c", "print('ran here')"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "ran here" in done.stdout  # a local task: SSH to that address would have been refused
        warnings = [line for line in done.stderr.splitlines() if line.startswith("mgpu: warning:")]
        if warned:
            assert len(warnings) == 1, done.stderr
            assert f"worker:0 serves TensorFlow on {PUBLIC_ADDRESS} port 2222, a public address" in warnings[0]
        else:
            assert warnings == [], done.stderr
        assert not run_processes(run_id)
