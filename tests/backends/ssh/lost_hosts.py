"""Five hosts, each in a network namespace of its own with its own sshd, and a run on three of them
(h1, h2, h3; h4 and h5 are spares) that loses hosts on cue: the lab of test_two_hosts_lost.py and
test_peer_lost_beside_a_spare.py (two files, so that two test processes share their waits)."""

from __future__ import annotations

import json
import os

import pytest

from launching import REPO, finish, start_mgpu, wait_for
from ssh_helpers import PYTHON, Netns, ip, lose, run_processes, start_sshd, unique_run_id

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
