"""Faults of a node under Slurm, on three network-namespace nodes (one cluster for the module, its
controller quick to mark a silent node down): a task stopped with SIGSTOP is named as the one the
others wait for, and a node whose slurmd is killed is charged host-lost and left out for the spare.
The slurmd test comes last: its node stays down for the rest of the cluster's life."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest

from slurm_netns import slurm_lab

pytestmark = [pytest.mark.netns, pytest.mark.slow]
MGPU = [sys.executable, "-m", "launcher"]


@pytest.fixture(scope="module")
def quick_to_fail(tmp_path_factory):
    """Three nodes whose controller marks one DOWN about 10 s after its slurmd is gone (its pings
    fail after MessageTimeout, 3 s; the node is down once none answered for SlurmdTimeout, 5 s)."""
    yield from slurm_lab(tmp_path_factory, ("h1", "h2", "h3"), slurmd_timeout=5, message_timeout=3)


def test_a_stopped_task_is_named_as_the_one_the_others_wait_for(quick_to_fail, tmp_path):
    """worker:1 on h2 stops itself (SIGSTOP) while worker:0 waits: the stall is charged to worker:1
    on h2, whose process state (T) is read on its node in a step beside the tasks'. h2 is not this
    machine's host name, by which `scontrol listpids` finds its node unless it is given the node's."""
    lab, runs = quick_to_fail, tmp_path / "runs"
    program = 'echo "on $SLURMD_NODENAME"; if [ "$SLURMD_NODENAME" = h2 ]; then kill -STOP $$; fi; exec sleep 60'
    argv = [*MGPU, "launch", "--slurm", "--stall-timeout", "3", "--max-restarts", "0", "--grace-period", "1",
            "--run-id", "stopped", "--log-dir", str(runs), "--", "sh", "-c", program]
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    done = lab.run("sbatch", "--wait", "--nodes=2", "--nodelist=h1,h2", "--ntasks-per-node=1", "--time=5",
                   f"--output={tmp_path}/job.out", str(script), cwd=tmp_path, timeout=120)
    output = (tmp_path / "job.out").read_text()
    record = json.loads((runs / "stopped" / "run.json").read_text())
    # No restart allowed: the run fails. Its exit code is mgpu's own, from run.json: sbatch's can be lost
    # (0, "Job 1 no longer found"), as the cluster forgets an ended job within MinJobAge, 2 s.
    assert record["exit_code"] == 1, (done.stderr, output[-4000:])
    first = record["attempts"][0]
    assert (first["cause"], first["task"], first["host"]) == ("stalled", "worker:1", "h2"), output[-4000:]


def test_a_node_whose_slurmd_is_killed_is_charged_host_lost_and_its_task_goes_to_the_spare(
        quick_to_fail, tmp_path):
    """h2's slurmd is killed while its task runs (an allocation submitted with --no-kill): the
    controller marks h2 DOWN and ends the step, srun says h1's task was killed and nothing of h2's;
    the attempt is charged host-lost to worker:1 on h2 (its node's state, asked once the step
    ended), and the spare h3 takes worker:1."""
    lab, runs, up = quick_to_fail, tmp_path / "runs", tmp_path / "h2-up"
    program = (f'if [ "$MGPU_ATTEMPT" = 0 ]; then [ "$SLURMD_NODENAME" = h2 ] && touch {up}; exec sleep 120; fi; '
               'echo "on $SLURMD_NODENAME"')
    argv = [*MGPU, "launch", "--slurm", "--spare-hosts", "h3", "--max-restarts", "2", "--grace-period", "1",
            "--run-id", "slurmd-killed", "--log-dir", str(runs), "--", "sh", "-c", program]
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    job = subprocess.Popen(["sbatch", "--wait", "--no-kill", "--no-requeue", "--nodes=3", "--ntasks-per-node=1",
                            "--time=5", f"--output={tmp_path}/job.out", str(script)], env=lab.env, cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not up.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert up.exists(), lab.log_tail()
        # The stepds stop() ends are this cluster's own: the batch script's and the step's.
        assert len(lab.stepds()) >= 2, lab.log_tail()
        lab.kill_slurmd("h2")
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    output = (tmp_path / "job.out").read_text()
    record = json.loads((runs / "slurmd-killed" / "run.json").read_text())
    assert code == 0 and record["exit_code"] == 0, output[-4000:] + lab.log_tail()
    first = record["attempts"][0]
    assert (first["cause"], first["task"], first["host"]) == ("host-lost", "worker:1", "h2"), output[-4000:]
    # mgpu logs in to no node of an allocation: the controller's word stands in for a login.
    assert "Slurm says node h2 is down" in first["detail"] and "Slurm's controller has the node down" in first["detail"]
    assert "login" not in first["detail"]
    assert [(left["host"], left["replaced_by"]) for left in record["costs"]["left_out"]] == [
        ("h2", "h3 took worker:1")]
    assert "[worker:1] on h3" in output and "[worker:0] on h1" in output, output[-4000:]
