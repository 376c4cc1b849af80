"""Two hosts lost at once: a run on h1, h2 and h3 (spares h4, h5), each host in a network namespace
of its own with its own sshd. h1 and h2 die together (their links go down, every process in their
namespaces is killed): both are judged lost after the attempt and left out in one step, each taking
a spare of its own; with one spare only, the run stops and its relaunch command names neither. A
peer that dies while a spare is being made ready is the peer's fault: the spare is kept."""

from __future__ import annotations

import json
import os

import pytest

from launching import REPO, finish, start_mgpu, wait_for
from ssh_helpers import PYTHON, Netns, ip, run_processes, start_sshd, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(300)]

HOSTS = ("h1", "h2", "h3", "h4", "h5")

# Each worker listens on its TF_CONFIG port (how mgpu knows it joined), then steps in lockstep with
# the others through files in a shared folder (as a collective would: a worker whose peer is gone
# waits), worker 0 checkpointing the step; a restart resumes from the checkpoint.
PROGRAM = r"""
import json, os, pathlib, socket, sys, time
folder, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
tf = json.loads(os.environ["TF_CONFIG"])
index, attempt, workers = tf["task"]["index"], os.environ["MGPU_ATTEMPT"], len(tf["cluster"]["worker"])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(tf["cluster"]["worker"][index].rsplit(":", 1)[1])))
server.listen()
checkpoint = folder / "step"
start = int(checkpoint.read_text()) if checkpoint.exists() else 0
print(f"start step {start}", flush=True)
mine = folder / f"a{attempt}-w{index}"
peers = [folder / f"a{attempt}-w{i}" for i in range(workers) if i != index]
for step in range(start + 1, total + 1):
    for _ in range(1200):  # every peer's step before this one, 120 s at most
        if step == start + 1 or all(p.exists() and int(p.read_text() or 0) >= step - 1 for p in peers):
            break
        time.sleep(0.1)
    else:
        sys.exit(3)
    time.sleep(0.05)
    if index == 0:
        (folder / "step.tmp").write_text(str(step))
        (folder / "step.tmp").replace(checkpoint)
    tmp = mine.with_suffix(".tmp")
    tmp.write_text(str(step))
    tmp.replace(mine)
    print(f"MGPU_PROGRESS {step}/{total}", flush=True)
print("done", flush=True)
"""

# --setup: once armed (by the test), the next host to run it (a spare being made ready) says so and
# waits until the test lets it go, at most 60 s.
SETUP = ('if [ -e {d}/armed ]; then rm {d}/armed; touch {d}/held; i=0; '
         'while [ -e {d}/held ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; fi')


@pytest.fixture(scope="module")
def lab_of_five(ssh_lab, tmp_path_factory):
    """Hosts h1-h5 in network namespaces, each with its sshd on port 22; their known_hosts and ssh config."""
    from ssh_helpers import require_namespaces
    require_namespaces()
    directory = tmp_path_factory.mktemp("lost")
    lab = Netns.create(names=HOSTS)
    servers = {}
    try:
        for name, address in lab.hosts.items():
            servers[name] = start_sshd(directory, name, ssh_lab.authorized_keys, address=address, port=22,
                                       netns=lab.namespaces[name])
        known = directory / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in servers.values()))
        config = directory / "ssh_config"
        config.write_text("".join(f"Host {n}\n  HostName {a}\n  IdentityFile {ssh_lab.client_key}\n"
                                  for n, a in lab.hosts.items()) + f"Host *\n  User {ssh_lab.user}\n")
        yield lab, known, config, servers, directory, ssh_lab
    finally:
        for server in servers.values():
            server.stop()
        lab.destroy()


@pytest.fixture
def five_hosts(lab_of_five):
    """The lab, with every host brought back after the test (its link up, a new sshd with the same key)."""
    lab, known, config, servers, directory, ssh_lab = lab_of_five
    yield lab, known, config
    for name in HOSTS:
        ip("-n", lab.namespaces[name], "link", "set", "eth0", "up")
        if servers[name].proc.poll() is not None:
            servers[name] = start_sshd(directory, name, ssh_lab.authorized_keys, address=lab.hosts[name], port=22,
                                       netns=lab.namespaces[name])


def lose(lab: Netns, name: str) -> None:
    """The host dies: its link goes down, then every process in its namespace is killed."""
    ip("-n", lab.namespaces[name], "link", "set", "eth0", "down")
    for pid in ip("netns", "pids", lab.namespaces[name]).stdout.split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass


def run_losing(five_hosts, tmp_path, spares: str, lost: tuple[str, ...], during_spare_setup: str | None = None):
    """Launch on h1, h2 and h3 with `spares`; once the checkpoint is past step 10, lose the hosts
    `lost` together, and with `during_spare_setup`, lose that host too once a spare runs --setup.
    (exit code, output, run.json)."""
    lab, known, config = five_hosts
    run_id = unique_run_id("lost")
    folder = tmp_path / "shared"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    proc = start_mgpu("launch", "--workers", "h1:2222,h2:2222,h3:2222", "--spare-hosts", spares, "--max-restarts", "2",
                      "--ssh-config", str(config), "--known-hosts", str(known), "--keepalive", "1",
                      "--connect-timeout", "6", "--grace-period", "2", "--workdir", str(tmp_path),
                      "--setup", SETUP.format(d=folder), "--run-id", run_id,
                      "--", PYTHON, "-c", PROGRAM, str(folder), "40", cwd=tmp_path, env=env)
    try:
        checkpoint = folder / "step"
        wait_for(lambda: checkpoint.exists() and int(checkpoint.read_text() or 0) >= 10 or proc.poll() is not None,
                 120, "step 10")
        if during_spare_setup:
            (folder / "armed").touch()
        for name in lost:
            ip("-n", lab.namespaces[name], "link", "set", "eth0", "down")
        for name in lost:
            lose(lab, name)
        if during_spare_setup:
            wait_for(lambda: (folder / "held").exists() or proc.poll() is not None, 120, "a spare's --setup")
            lose(lab, during_spare_setup)
            (folder / "held").unlink(missing_ok=True)
        code, out = finish(proc, 200)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert not run_processes(run_id)
    return code, out, record


def test_two_hosts_lost_at_once_are_left_out_together_each_for_a_spare(five_hosts, tmp_path):
    code, out, record = run_losing(five_hosts, tmp_path, "h4,h5", ("h1", "h2"))
    assert code == 0, out[-4000:]
    first, second = record["attempts"]
    judged = {(first["task"], first["host"], first["cause"])} | {(c["task"], c["host"], c["cause"]) for c in first["also"]}
    assert judged == {("worker:0", "h1", "host-lost"), ("worker:1", "h2", "host-lost")}, first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {
        "worker:0": "h4", "worker:1": "h5", "worker:2": "h3"}
    assert sorted((c["host"], c["cause"], c["replaced_by"]) for c in record["costs"]["left_out"]) == [
        ("h1", "host-lost", "h4 took worker:0"), ("h2", "host-lost", "h5 took worker:1")]
    assert "restarting all tasks without h1, h2 (restart 1 of 2)" in out or \
        "restarting all tasks without h2, h1 (restart 1 of 2)" in out, out[-4000:]
    assert "failed its checks" not in out, out[-4000:]


def test_without_a_spare_for_each_the_relaunch_command_names_no_lost_host(five_hosts, tmp_path):
    code, out, record = run_losing(five_hosts, tmp_path, "h4", ("h1", "h2"))
    assert code == 1, out[-4000:]
    report = out[out.index("mgpu: error: "):].splitlines()
    assert report[0].startswith("mgpu: error: h") and " and no spare host to take worker:0, worker:1; " \
        "relaunch without them:" in report[0], report
    assert "h1 left out (host-lost: " in report[0] and "h2 left out (host-lost: " in report[0], report
    relaunch = report[1]
    assert relaunch.startswith("  mgpu launch --workers h3:2222 --spare-hosts h4 --max-restarts 2 "), report
    assert "h1" not in relaunch and "h2" not in relaunch, relaunch
    assert "failed its checks" not in out, out[-4000:]  # the spare was never charged
    assert [a["cause"] for a in record["attempts"]] == ["host-lost"]


def test_a_peer_lost_while_a_spare_is_made_ready_is_the_peers_fault(five_hosts, tmp_path):
    code, out, record = run_losing(five_hosts, tmp_path, "h4,h5", ("h1",), during_spare_setup="h2")
    assert code == 0, out[-4000:]
    first, second = record["attempts"]
    assert (first["cause"], first["task"], first["host"]) == ("host-lost", "worker:0", "h1"), first
    assert "also" not in first, first  # h2 was well when the attempt was judged
    assert "h2 is gone too: the spares' check cannot log in to it; it is left out, not the spares" in out, out[-4000:]
    assert "spare host h4 failed its checks" not in out, out[-4000:]
    assert {name: task["host"] for name, task in second["tasks"].items()} == {
        "worker:0": "h4", "worker:1": "h5", "worker:2": "h3"}
    assert sorted((c["host"], c["replaced_by"]) for c in record["costs"]["left_out"]) == [
        ("h1", "h4 took worker:0"), ("h2", "h5 took worker:1")]
