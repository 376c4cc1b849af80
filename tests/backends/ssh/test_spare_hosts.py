"""A host lost in the middle of a run: three hosts in network namespaces of their own, each with its
own sshd. h2 dies (its link goes down and every process in its namespace is killed); with a spare,
h3 takes its task and the run resumes from its checkpoint; without one, the run stops and says how
to relaunch without h2. A spare at a public address gets the exposure warning, as the hosts of the
first start do (shown in the run where the spare takes over: one host's loss spent on both)."""

from __future__ import annotations

import contextlib
import json
import subprocess

import pytest

import lab_mgpu
from launching import REPO, finish, run_mgpu, wait_for
from launcher.host.quarantine_file import QuarantineFile
from netns_hosts import Netns, ip, lose
from ssh_helpers import PYTHON, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(240)]

# The workers step in lockstep, worker 0 checkpointing; in the first attempt they wait after step
# HOLD_AT, where the test loses h2, and a restart resumes from that step's checkpoint.
PROGRAM = str(REPO / "tests" / "programs" / "lockstep.py")
TOTAL, HOLD_AT = "8", 5


@pytest.fixture
def three_hosts(lab_of_three):
    """The lab, with h2 brought back after the test."""
    yield lab_of_three.lab, lab_of_three.known, lab_of_three.config
    lab_of_three.bring_back(["h2"])


def run_losing_h2(three_hosts, tmp_path, *spares: str):
    """Launch on h1 and h2, lose h2 once the workers wait after step HOLD_AT; (exit code, output, run.json,
    run folder). Each event's notice (--notify) is a line of tmp_path / "events"."""
    lab, known, config = three_hosts
    run_id = unique_run_id("spare")
    folder = tmp_path / "shared"
    folder.mkdir()
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", "h1:2222,h2:2222", *spares, "--max-restarts", "2",
                          "--ssh-config", str(config), "--known-hosts", str(known), "--keepalive", "1",
                          "--connect-timeout", "6", "--grace-period", "2", "--workdir", str(tmp_path), "--run-id",
                          run_id, "--notify", f"printf '%s\\n' \"$MGPU_EVENT\" >> {tmp_path / 'events'}",
                          "--", PYTHON, PROGRAM, str(folder), TOTAL, str(HOLD_AT), stderr=subprocess.STDOUT, text=True)
    try:
        checkpoint = folder / "step"
        wait_for(lambda: checkpoint.exists() and checkpoint.read_text() == str(HOLD_AT) or proc.poll() is not None,
                 120, f"step {HOLD_AT}")
        lose(lab, "h2")
        code, out = finish(proc, 180)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert not run_processes(run_id)
    return code, out, record, tmp_path / "mgpu-runs" / run_id


def notices(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "events").read_text().splitlines()]


def test_a_spare_takes_the_lost_hosts_task_and_the_run_resumes(three_hosts, lab_of_three, tmp_path):
    """The spare h3's ssh config names its public address, as a cloud host's may: h1 and h2 are on
    private addresses (no warning at the start); h3's task serves there once it takes h2's, and is
    warned about as the first start's would be."""
    lab, known, config = three_hosts
    with at_public_address(lab, "h3") as public:
        public_config = tmp_path / "ssh_config"
        public_config.write_text(config.read_text().replace(f"HostName {lab.hosts['h3']}\n", f"HostName {public}\n"))
        public_known = tmp_path / "known_hosts"
        public_known.write_text(known.read_text() + f"{public} ssh-ed25519 {lab_of_three.servers['h3'].public_key}\n")
        code, out, record, run_dir = run_losing_h2((lab, public_known, public_config), tmp_path, "--spare-hosts", "h3")
    assert code == 0, out[-4000:]
    exposed = [line for line in out.splitlines() if "a public address" in line]
    assert len(exposed) == 1 and exposed[0].startswith(
        f"mgpu: warning: worker:1 serves TensorFlow on h3 ({public}) port 2222, a public address; "), out[-4000:]
    first, second = record["attempts"]
    assert (first["cause"], first["task"], first["host"]) == ("host-lost", "worker:1", "h2"), first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {"worker:0": "h1", "worker:1": "h3"}
    assert [(c["host"], c["cause"], c["replaced_by"]) for c in record["costs"]["left_out"]] == [
        ("h2", "host-lost", "h3 took worker:1")]
    # The second attempt resumed from the checkpoint of the step the first one reached.
    resumed = [line for line in (run_dir / "worker-1.log").read_text().splitlines() if line.startswith("start step")]
    assert resumed == ["start step 0", f"start step {HOLD_AT}"], resumed
    closing = out.splitlines()[-1]
    assert closing.startswith("[mgpu] done: 2 tasks succeeded in ") and "; 1 restart (h2 lost at " in closing, closing
    assert "h3 took worker:1)" in closing, closing
    # h2 is remembered: the next launch on it gives its task to the spare before the start.
    (held,) = QuarantineFile().entries()
    assert (held.host, held.cause, held.run_id) == ("h2", "host-lost", record["run_id"]), held
    assert f"quarantined h2 for 1d ({QuarantineFile().path}; " in out, out[-4000:]
    again = run_mgpu("launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h3", "--ssh-config",
                     str(three_hosts[2]), "--dry-run", "--json")
    assert [task["host"] for task in json.loads(again.stdout)["tasks"]] == ["h1", "h3"], again.stderr
    assert again.stderr.startswith("mgpu: warning: h2 is quarantined (host-lost in run "), again.stderr
    assert [(e["host"], e["spare"]) for e in notices(tmp_path) if e["event"] == "host-left-out"] == [("h2", "h3")]


def test_without_a_spare_the_run_stops_naming_the_lost_host_and_the_relaunch_command(three_hosts, tmp_path):
    code, out, record, _ = run_losing_h2(three_hosts, tmp_path)
    assert code == 1, out[-4000:]
    report = out[out.index("mgpu: error: "):].splitlines()
    assert report[0].startswith("mgpu: error: h2 left out (host-lost: ") and \
        report[0].endswith(" and no spare host to take worker:1; relaunch without it:"), report
    assert report[1].startswith("  mgpu launch --workers h1:2222 --max-restarts 2 "), report
    assert "--run-id" not in report[1]
    assert [a["cause"] for a in record["attempts"]] == ["host-lost"]
    assert [held.host for held in QuarantineFile().entries()] == ["h2"]
    assert [(e["host"], e["spare"]) for e in notices(tmp_path) if e["event"] == "host-left-out"] == [("h2", None)]
    assert notices(tmp_path)[-1]["status"] == "failed"
    assert record["costs"]["restarts"] == 0  # it stopped there: no restart was made


def test_an_exit_code_ruled_leave_out_host_gives_the_hosts_tasks_to_a_spare(three_hosts, tmp_path):
    """--exit-codes 13=leave-out-host: the program's worker on h2 exits 13 in the first attempt (its
    host found unfit, by its own judgement); h2 is left out and the spare h3 takes its task."""
    run_id = unique_run_id("leaveout")
    code = ("import os, sys\nsys.exit(13 if os.environ['MGPU_ATTEMPT'] == '0' and "
            "os.environ['MGPU_TASK_INDEX'] == '1' else 0)")
    done = lab_mgpu.run(tmp_path, "launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h3",
                        *lab_mgpu.ssh_files(three_hosts), "--connect-timeout", "6", "--grace-period", "2",
                        "--max-restarts", "1", "--exit-codes", "13=leave-out-host", "--workdir", str(tmp_path),
                        "--run-id", run_id, "--", PYTHON, "-c", code, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    first, second = record["attempts"]
    assert (first["cause"], first["task"], first["host"], first["rule"]) == (
        "program-error", "worker:1", "h2", {"code": 13, "action": "leave-out-host", "source": "--exit-codes"}), first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {"worker:0": "h1", "worker:1": "h3"}
    assert ("[mgpu] h2 left out for the rest of the run (program-error: exited with code 13 "
            "(rule 13=leave-out-host, from --exit-codes)); h3 took worker:1") in out, out[-4000:]
    assert not run_processes(run_id)


def test_check_looks_at_the_spares_too(three_hosts, tmp_path):
    lab, known, config = three_hosts
    args = ["check", "--workers", "h1:2222,h2:2222", *lab_mgpu.ssh_files(three_hosts), "--connect-timeout", "6",
            "--spare-hosts", "h3", "--", PYTHON, "-c", "pass"]
    done = lab_mgpu.run(tmp_path, *args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()} >= {"h1", "h2", "h3"}, done.stdout
    # A spare that cannot be reached fails the check. Its sshd's port refuses: the check does not
    # wait out its --connect-timeout, as it would for a host whose link is down.
    refuse = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    iptables = ["ip", "netns", "exec", lab.namespaces["h3"], "iptables"]
    subprocess.run([*iptables, "-A", *refuse], check=True)
    try:
        done = lab_mgpu.run(tmp_path, *args, timeout=120)
    finally:
        subprocess.run([*iptables, "-D", *refuse], check=True)
    assert done.returncode == 1 and "h3" in done.stdout + done.stderr, done.stdout + done.stderr


@contextlib.contextmanager
def at_public_address(lab: Netns, name: str):
    """Host `name` at a public address too, as a cloud host is: the address on its link, routes to it
    from this machine and the other hosts, its sshd's port there. Yields the address."""
    private, namespace = lab.hosts[name], lab.namespaces[name]
    public = f"100.0.{lab.subnet.rsplit('.', 1)[1]}.{private.rsplit('.', 1)[1]}"  # a lab's own
    nat = ["ip", "netns", "exec", namespace, "iptables", "-t", "nat"]
    rule = ["PREROUTING", "-d", public, "-p", "tcp", "--dport", "22", "-j", "DNAT", "--to-destination", f"{private}:22"]
    others = [ns for host, ns in lab.namespaces.items() if host != name]
    try:
        ip("-n", namespace, "addr", "add", f"{public}/32", "dev", "eth0")
        subprocess.run([*nat, "-A", *rule], check=True)
        ip("route", "add", f"{public}/32", "via", private)
        for other in others:
            ip("-n", other, "route", "add", f"{public}/32", "via", private)
        yield public
    finally:
        for other in others:
            ip("-n", other, "route", "del", f"{public}/32", check=False)
        ip("route", "del", f"{public}/32", check=False)
        subprocess.run([*nat, "-D", *rule], check=False)
        ip("-n", namespace, "addr", "del", f"{public}/32", "dev", "eth0", check=False)


# Worker 0 dials worker 1, which listens; a refused or dropped connection is reported in gRPC's words.
DIAL = r"""
import json, os, socket, sys, time
tf = json.loads(os.environ["TF_CONFIG"])
index = tf["task"]["index"]
host, port = tf["cluster"]["worker"][1].rsplit(":", 1)
if index == 1:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(port)))
    server.listen()
    time.sleep(60)
else:
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        sys.exit(f"failed to connect to all addresses: {host}:{port}: {e}")
"""


def test_a_peer_that_cannot_be_reached_is_charged_to_the_network(three_hosts, tmp_path):
    lab, known, config = three_hosts
    rule = ["INPUT", "-i", "eth0", "-p", "tcp", "--dport", "2222", "-j", "DROP"]
    iptables = ["ip", "netns", "exec", lab.namespaces["h2"], "iptables"]
    subprocess.run([*iptables, "-A", *rule], check=True)
    try:
        run_id = unique_run_id("network")
        done = lab_mgpu.run(tmp_path, "launch", "--workers", "h1:2222,h2:2222", "--no-check", "--max-restarts", "1",
                            *lab_mgpu.ssh_files(three_hosts), "--grace-period", "2", "--run-id", run_id, "--", PYTHON,
                            "-c", DIAL, timeout=120)
    finally:
        subprocess.run([*iptables, "-D", *rule], check=True)
    assert done.returncode == 1, done.stdout + done.stderr
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    first = record["attempts"][0]
    assert (first["cause"], first["task"], first["host"], first["detail"]) == (
        "network", "worker:1", "h2", "h1 cannot reach h2"), first
    assert "mgpu: error: h2 left out (network: h1 cannot reach h2) and no spare host to take worker:1" in done.stderr
    assert not run_processes(run_id)


def launch_with_health_check(three_hosts, tmp_path, check: str, program: str) -> tuple[int, str, dict]:
    """Launch a short program on h1 and h2 with h3 as a spare and this health check; (exit code,
    output, run.json)."""
    lab, known, config = three_hosts
    run_id = unique_run_id("health")
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h3", "--max-restarts",
                          "1", "--ssh-config", str(config), "--known-hosts", str(known), "--connect-timeout", "6",
                          "--grace-period", "1", "--workdir", str(tmp_path), "--run-id", run_id,
                          "--health-check", check, "--", PYTHON, "-c", program, stderr=subprocess.STDOUT, text=True)
    try:
        code, out = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, out, json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())


def failing_on_h2(lab: Netns, marker) -> str:
    """A health check that fails on h2 (told by the address its SSH session reached) once `marker` exists."""
    return (f'case "$SSH_CONNECTION" in *" {lab.hosts["h2"]} "*) test -e {marker} && '
            f'{{ echo checking; echo "GPU 1: NCCL all-reduce 0.3 GB/s" >&2; exit 3; }};; esac; true')


def test_a_host_that_fails_its_health_check_before_the_start_gives_its_tasks_to_a_spare(three_hosts, tmp_path):
    (tmp_path / "sick").touch()
    code, out, record = launch_with_health_check(three_hosts, tmp_path, failing_on_h2(three_hosts[0], tmp_path / "sick"),
                                                 "pass")
    assert code == 0, out[-4000:]
    assert "mgpu: left out h2: its health check failed (the health check exited with code 3: GPU 1: NCCL " \
           "all-reduce 0.3 GB/s); spare host h3 takes its tasks" in out, out[-4000:]
    (attempt,) = record["attempts"]
    assert {name: task["host"] for name, task in attempt["tasks"].items()} == {"worker:0": "h1", "worker:1": "h3"}
    assert [(held.host, held.cause) for held in QuarantineFile().entries()] == [("h2", "health-check")]


# A host that fails its health check after a failed attempt, left out before the restart for the next
# spare that passes: test_spares_made_ready.py.
