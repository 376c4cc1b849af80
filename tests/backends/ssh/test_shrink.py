"""A run that goes on on fewer hosts (--min-hosts) and takes its host back: three hosts in network
namespaces of their own, each with its own sshd, run a PyTorch DDP program (gloo, CPU) with
--min-hosts 2 and no spare. h1, whose task is rank 0 and so the coordinator, dies mid-run (its link
goes down and every process in its namespace is killed): the plans are made again for h2 and h3,
the coordinator moves to h2, and the run goes on there, resumed from its checkpoint past step 0 at
WORLD_SIZE 2. Then h1 comes back (its link up, its sshd again): a probe finds it, and right after
the next checkpoint line the cluster restarts on all three, and finishes there. A `--notify`
command is told each step: h1 left out, the size changed, h1 taken back, the size changed again.

The built-in trainer does the same on the same hosts (h2 lost, then taken back): it resumes on two
with the nearest global batch that divides, and on three again with the planned one, from the first
example the two did not train on, its replicas ending with the same weights."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from needs import installed_version, require

from launching import REPO, finish, start_mgpu, wait_for
from netns_hosts import ip, lose
from ssh_helpers import PYTHON, run_processes, start_sshd, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(240)]

PROGRAM = str(REPO / "tests" / "programs" / "torch_shrink.py")


@pytest.fixture
def hosts(lab_of_three):
    """The lab; `revive("h1")` brings a host back (its link up, a new sshd with the same host key),
    as every host is after the test whatever happened."""
    lab, known, config, servers, directory, ssh_lab = lab_of_three

    def revive(name: str) -> None:
        ip("-n", lab.namespaces[name], "link", "set", "eth0", "up")
        if servers[name].proc.poll() is not None:
            servers[name] = start_sshd(directory, name, ssh_lab.authorized_keys, address=lab.hosts[name], port=22,
                                       netns=lab.namespaces[name])

    yield lab, known, config, revive
    for name in lab.namespaces:
        revive(name)


@pytest.fixture
def lab(hosts):
    require("torch")
    return hosts


def record_of(run_dir) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def progress(run_dir) -> int:
    """The highest step a task of the run's last attempt reported (0 before any)."""
    attempts = record_of(run_dir).get("attempts") or [{}]
    return max((task["progress"]["step"] for task in attempts[-1].get("tasks", {}).values()
                if task.get("progress")), default=0)


def test_a_lost_host_with_no_spare_leaves_the_run_on_two_hosts_until_it_is_back(lab, tmp_path):
    netns, known, config, revive = lab
    run_id = unique_run_id("shrink")
    run_dir = tmp_path / "mgpu-runs" / run_id
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "slow").touch()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    proc = start_mgpu("launch", "--workers", "h1:2222,h2:2222,h3:2222", "--min-hosts", "2", "--max-restarts", "2",
                      "--rejoin-interval", "2", "--ssh-config", str(config), "--known-hosts", str(known),
                      "--keepalive", "1", "--connect-timeout", "6", "--grace-period", "2", "--workdir", str(tmp_path),
                      "--run-id", run_id, "--notify", f"cat >> {tmp_path / 'events'}; echo >> {tmp_path / 'events'}",
                      "--", PYTHON, PROGRAM, str(folder), "200", cwd=tmp_path, env=env)
    try:
        wait_for(lambda: progress(run_dir) >= 8 or proc.poll() is not None, 150, "step 8")
        lose(netns, "h1")
        wait_for(lambda: record_of(run_dir).get("size_changes") or proc.poll() is not None, 120, "the size change")
        revive("h1")
        wait_for(lambda: len(record_of(run_dir).get("size_changes", ())) == 2 or proc.poll() is not None, 120,
                 "h1 taken back")
        (folder / "slow").unlink()
        code, out = finish(proc, 180)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = record_of(run_dir)
    assert not run_processes(run_id)
    assert code == 0, out[-4000:]
    first, second, third = record["attempts"]
    assert (first["cause"], first["host"]) == ("host-lost", "h1"), first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {"worker:0": "h2", "worker:1": "h3"}
    assert {name: task["host"] for name, task in third["tasks"].items()} == {
        "worker:0": "h2", "worker:1": "h3", "worker:2": "h1"}
    assert second["outcome"] == "resized", second
    # The output names the lost host and the new size; the tasks left were renumbered.
    assert "no spare host for h1: the run goes on on 2 of 3 hosts (--min-hosts 2), 2 tasks in place of 3; " \
           "worker:1 is worker:0 now; worker:2 is worker:1 now" in out, out[-4000:]
    assert "[mgpu] h1 answers again and passed its checks: it joins the cluster at the next restart" in out, out[-4000:]
    assert "[mgpu] h1 back: the run goes on on 3 of 3 hosts, 3 tasks in place of 2" in out, out[-4000:]
    shrink, growth = record["size_changes"]
    assert (shrink["dropped"], shrink["hosts"], shrink["tasks"]) == (
        ["h1"], {"from": 3, "to": 2, "planned": 3}, {"from": 3, "to": 2})
    assert (growth["back"], growth["hosts"]) == (["h1"], {"from": 2, "to": 3, "planned": 3})
    told = [json.loads(line) for line in (tmp_path / "events").read_text().splitlines()]
    assert [event["event"] for event in told] == ["run-started", "attempt-failed", "host-left-out", "size-changed",
                                                  "host-taken-back", "size-changed", "run-ended"], told
    left, smaller, back, bigger = told[2:6]
    assert (left["host"], left["spare"], left["goes_on"]) == ("h1", None, True), left
    assert left["text"].endswith("; no spare left: the run goes on without it"), left
    assert (smaller["hosts_from"], smaller["hosts_to"], smaller["planned"], smaller["dropped"]) == (3, 2, 3, ["h1"])
    assert smaller["why"].startswith("h1: host-lost: "), smaller
    assert back["host"] == "h1" and back["text"] == f"run {run_id}: h1 taken back", back
    assert (bigger["hosts_from"], bigger["hosts_to"], bigger["back"], bigger["dropped"]) == (2, 3, ["h1"], []), bigger
    assert bigger["text"] == f"run {run_id}: now on 3 of 3 hosts, from 2: h1 taken back", bigger
    # WORLD_SIZE seen to change (the planned size stays); each attempt resumed from the checkpoint.
    worlds = re.findall(r"world (\d) of (\d), rank (\d)", out)
    assert sorted(set(worlds)) == [("2", "3", "0"), ("2", "3", "1"), ("3", "3", "0"), ("3", "3", "1"),
                                   ("3", "3", "2")], worlds
    log = (run_dir / "worker-0.log").read_text()
    starts = [int(n) for n in re.findall(r"start step (\d+)", log)]
    # The checkpoint lines are mgpu's to read: in the log, not on the console.
    assert "MGPU_CHECKPOINT 1\n" in log and "MGPU_CHECKPOINT" not in out, out[-2000:]
    assert len(starts) == 3 and starts[0] == 0 and 8 <= starts[1] < starts[2], starts
    closing = out.splitlines()[-1]
    assert closing.startswith("[mgpu] done: 3 tasks succeeded in ") and "; 2 restarts (h1 lost at " in closing, closing
    assert re.search(r"; ran on 2 of 3 hosts for [^;]+; h1 back at \d\d:\d\d\)", closing), closing
    status = subprocess.run([PYTHON, "-m", "launcher", "status", run_id], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    # Back on all three hosts it was planned on: `mgpu status` has no size to say.
    assert status.stdout.startswith(f"run {run_id}: succeeded") and "size:" not in status.stdout, status.stdout


TRAINER = str(REPO / "tests" / "programs" / "paced_trainer.py")
GLOBAL_BATCH = 45  # divides among 3 replicas, not among 2


def attempts_of(log: str) -> list[list[str]]:
    """A task's log lines, one list per attempt (the launcher heads each attempt after the first)."""
    return [attempt.splitlines() for attempt in re.split(r"^----- mgpu: attempt \d+ started .*$", log, flags=re.M)]


def test_the_trainer_goes_on_on_two_hosts_then_three_with_its_stream_and_batch(hosts, tmp_path):
    """The built-in trainer, planned on three hosts with a global batch of 45: h2 dies past the first
    checkpoint, the chief resumes on two (44, the nearest batch that divides), h2 comes back and is
    taken back right after a checkpoint, and the run ends on three with the planned batch, from the
    first example the two did not train on, every replica with the same weights."""
    installed_version("tensorflow", "the train extra")
    netns, known, config, revive = hosts
    run_id = unique_run_id("shrink-trainer")
    run_dir = tmp_path / "mgpu-runs" / run_id
    model = tmp_path / "model"
    folder = tmp_path / "pace"
    folder.mkdir()
    (folder / "slow").touch()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    proc = start_mgpu("launch", "--workers", "h1:2222,h2:2222,h3:2222", "--min-hosts", "2", "--max-restarts", "2",
                      "--rejoin-interval", "2", "--ssh-config", str(config), "--known-hosts", str(known),
                      "--keepalive", "1", "--connect-timeout", "6", "--grace-period", "2", "--workdir", str(tmp_path),
                      "--run-id", run_id, "--env", f"PYTHONPATH={REPO}", "--start-timeout", "120",
                      "--", PYTHON, TRAINER, str(folder), "--model", "small", "--dataset", "synthetic",
                      "--threads", "1",
                      "--global-batch-size", str(GLOBAL_BATCH), "--train-steps", "200", "--log-every", "5",
                      "--steps-per-loop", "5", "--checkpoint-every", "5", "--eval-steps", "1",
                      "--model-dir", str(model), cwd=tmp_path, env=env)
    try:
        wait_for(lambda: progress(run_dir) >= 10 or proc.poll() is not None, 180, "step 10")
        lose(netns, "h2")
        wait_for(lambda: record_of(run_dir).get("size_changes") or proc.poll() is not None, 120, "the size change")
        revive("h2")
        wait_for(lambda: len(record_of(run_dir).get("size_changes", ())) == 2 or proc.poll() is not None, 180,
                 "h2 taken back")
        (folder / "slow").unlink()
        code, out = finish(proc, 240)
    finally:
        if proc.poll() is None:
            proc.kill()
    record = record_of(run_dir)
    assert not run_processes(run_id)
    assert code == 0, out[-4000:]
    first, second, third = record["attempts"]
    assert (first["cause"], first["host"]) == ("host-lost", "h2"), first
    assert {name: task["host"] for name, task in second["tasks"].items()} == {"worker:0": "h1", "worker:1": "h3"}
    assert second["outcome"] == "resized", second
    assert {name: task["host"] for name, task in third["tasks"].items()} == {
        "worker:0": "h1", "worker:1": "h3", "worker:2": "h2"}
    # The output names the lost host and the new size.
    assert "no spare host for h2: the run goes on on 2 of 3 hosts (--min-hosts 2), 2 tasks in place of 3; " \
           "worker:2 is worker:1 now" in out, out[-4000:]
    assert "[mgpu] h2 back: the run goes on on 3 of 3 hosts, 3 tasks in place of 2" in out, out[-4000:]

    # The chief, worker:0 on h1 at every size, says how it resumed.
    on_three, on_two, again_on_three = attempts_of((run_dir / "worker-0.log").read_text())
    assert not [line for line in on_three if "planned workers" in line or line.startswith("resumed from")], on_three
    assert f"3 worker(s), 3 replica(s), global batch {GLOBAL_BATCH}," in "\n".join(on_three), on_three
    # Two of the three: the planned batch does not divide among them, and one line says what is used instead.
    assert ("on 2 of the 3 planned workers: the planned global batch 45 does not divide among 2 replicas; "
            "global batch 44, 22 per replica") in on_two, on_two
    assert "2 worker(s), 2 replica(s), global batch 44," in "\n".join(on_two), on_two
    shrunk = [line for line in on_two if line.startswith("resumed from")]
    assert len(shrunk) == 1, on_two
    step_on_two = int(re.fullmatch(rf"resumed from {re.escape(str(model))}/ckpt-(\d+) at step \1, example (\d+) of "
                                   r"the training stream, written by 3 workers, now 2", shrunk[0])[1])
    assert step_on_two >= 5 and f"example {step_on_two * 45} of" in shrunk[0], shrunk
    # Three again: the planned batch, from the first example the two did not train on.
    assert not [line for line in again_on_three if "planned workers" in line], again_on_three
    assert f"3 worker(s), 3 replica(s), global batch {GLOBAL_BATCH}," in "\n".join(again_on_three), again_on_three
    grown = [line for line in again_on_three if line.startswith("resumed from")]
    assert len(grown) == 1, again_on_three
    step_on_three = int(re.fullmatch(rf"resumed from {re.escape(str(model))}/ckpt-(\d+) at step \1, example \d+ of "
                                     r"the training stream, written by 2 workers, now 3", grown[0])[1])
    assert step_on_three > step_on_two, (step_on_two, step_on_three)
    assert f"example {step_on_two * 45 + (step_on_three - step_on_two) * 44} of" in grown[0], grown
    # Each start trained from where the one before it ended: its first log line is 5 steps past the checkpoint.
    for lines, resumed_at in ((on_two, step_on_two), (again_on_three, step_on_three)):
        logged = [int(re.search(r"train step=(\d+)/", line)[1]) for line in lines if line.startswith("train step=")]
        assert logged[0] == resumed_at + 5, (resumed_at, lines)
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["global_step"] == 200 and metrics["num_replicas"] == 3, metrics
    assert len(metrics["replica_fingerprints"]) == 3 and len(set(metrics["replica_fingerprints"])) == 1, metrics
