"""Spares made ready as the first start's hosts are, in one run on five hosts in network namespaces
that share no workdir (each sshd has a tmpfs of its own over PRIVATE_DIR): h1 and h2 run the tasks,
h3, h4 and h5 are spares, tried in that order. The first attempt fails on h2 and makes it fail its
health check, so h2 is left out before the restart, though the failure is charged to its task. h3
fails its checks (its task's port is taken) and h4 its health check: each is named with why and
skipped, h4 quarantined; h5 takes h2's task, with its own copy of the --sync folder and the
--setup's mark in it before its task starts (the task is the synced program, which fails without
the mark)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import lab_mgpu
from launcher.host.quarantine_file import QuarantineFile
from launching import finish, wait_for
from namespace_labs import hosts_lab
from ssh_helpers import PYTHON, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(240)]

PRIVATE_DIR = f"/tmp/mgpu-spares-private-{os.getpid()}"
WORKDIR = f"{PRIVATE_DIR}/project"
MARK = "set-up-here"

# The synced program. It needs the setup's mark beside it; in the first attempt worker 1 makes its
# host sick (the file argv[1]) and fails, worker 0 waits to be stopped.
TRAIN = f"""import json, os, pathlib, sys, time
if not os.path.exists({MARK!r}):
    sys.exit("no --setup mark in " + os.getcwd())
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if os.environ["MGPU_ATTEMPT"] == "0":
    if index == 0:
        time.sleep(60)
    pathlib.Path(sys.argv[1]).touch()
    sys.exit(1)
print("ran beside the setup's mark in", os.getcwd(), flush=True)
"""


@pytest.fixture(scope="module")
def five_private_hosts(ssh_lab, tmp_path_factory):
    os.makedirs(PRIVATE_DIR, exist_ok=True)
    try:
        with hosts_lab(ssh_lab, tmp_path_factory.mktemp("spares-ready"), ("h1", "h2", "h3", "h4", "h5"),
                       private_dir=PRIVATE_DIR) as lab:
            yield lab
    finally:
        os.rmdir(PRIVATE_DIR)


def holding_port(namespace: str, port: int) -> subprocess.Popen:
    """A process in `namespace` listening on `port`, once it listens."""
    holder = subprocess.Popen(
        ["ip", "netns", "exec", namespace, PYTHON, "-c",
         f"import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', {port}))\ns.listen()\n"
         f"print('listening', flush=True)\ntime.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "listening":
        holder.kill()
        holder.wait()
        raise AssertionError(f"nothing listens on port {port} in {namespace}")
    return holder


def test_spares_that_fail_are_named_and_skipped_and_the_one_taken_gets_sync_and_setup(five_private_hosts,
                                                                                      tmp_path):
    lab = five_private_hosts.lab
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    sick = tmp_path / "sick"
    health = (f'case "$SSH_CONNECTION" in *" {lab.hosts["h2"]} "*) test -e {sick} && '
              f'{{ echo "GPU 1: NCCL all-reduce 0.3 GB/s" >&2; exit 3; }};; '
              f'*" {lab.hosts["h4"]} "*) echo "GPU 0: 12 uncorrectable ECC errors" >&2; exit 4;; esac; true')
    run_id = unique_run_id("spares-ready")
    holder = holding_port(lab.namespaces["h3"], 2222)
    try:
        proc = lab_mgpu.start(tmp_path, "launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h3,h4,h5",
                              "--max-restarts", "1", *lab_mgpu.ssh_files(five_private_hosts), "--connect-timeout",
                              "6", "--grace-period", "1", "--workdir", WORKDIR, "--sync", str(project), "--setup",
                              f"touch {MARK}", "--health-check", health, "--run-id", run_id, "--", PYTHON,
                              "train.py", str(sick), stderr=subprocess.STDOUT, text=True)
        try:
            code, out = finish(proc, 180)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        holder.kill()
        holder.wait()
    assert code == 0, out[-4000:]
    assert "spare host h3 failed its checks: " in out and "port 2222 in use" in \
        out[out.index("spare host h3 failed its checks: "):].splitlines()[0], out[-4000:]
    assert "spare host h4 failed its checks: its health check failed: the health check exited with code 4: " \
           "GPU 0: 12 uncorrectable ECC errors" in out, out[-4000:]
    assert "spare host h5 failed" not in out, out[-4000:]
    assert "h2 left out for the rest of the run (health-check: the health check exited with code 3: GPU 1: NCCL " \
           "all-reduce 0.3 GB/s); h5 took worker:1" in out, out[-4000:]
    assert "restarting all tasks without h2 (restart 1 of 1)" in out, out[-4000:]
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    first, second = record["attempts"]
    assert (first["cause"], first["task"], first["host"]) == ("program-error", "worker:1", "h2"), first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {"worker:0": "h1", "worker:1": "h5"}
    # h5's task ran the synced program beside the setup's mark, on h5's own folder.
    assert f"[worker:1] ran beside the setup's mark in {WORKDIR}" in out, out[-4000:]
    h5 = five_private_hosts.servers["h5"]
    assert h5.private_path(f"{WORKDIR}/train.py").read_text() == TRAIN
    assert h5.private_path(f"{WORKDIR}/{MARK}").exists()
    assert f"mgpu: sync h5:{WORKDIR}: 1 file(s) copied" in out, out[-4000:]
    assert not os.path.exists(f"{WORKDIR}/train.py")  # this machine shares none of it
    # The spare failing its health check is quarantined with h2; h3's taken port is no fault of the host's.
    held = sorted((entry.host, entry.cause, entry.run_id) for entry in QuarantineFile().entries())
    assert held == [("h2", "health-check", run_id), ("h4", "health-check", run_id)], held
    listed = lab_mgpu.run(tmp_path, "hosts", timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert sorted(rows) == ["h2", "h4"], listed.stdout
    assert rows["h4"].split()[1] == "health-check" and run_id in rows["h4"] and \
        rows["h4"].endswith("the health check exited with code 4: GPU 0: 12 uncorrectable ECC errors"), listed.stdout
    wait_for(lambda: not run_processes(run_id), 30, "the run's processes to end")
