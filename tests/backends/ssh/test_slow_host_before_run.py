"""A slow host made real: its sshd in a cgroup held to a small fraction of one core, so that every
session it starts (the probes, the tasks) is too. `mgpu check` names it with its figures, an even
pair names no one, and `mgpu launch --leave-out-slow` gives its tasks to a spare."""

from __future__ import annotations

import contextlib
import json
import subprocess

import pytest

import lab_mgpu
from cpu_limits import cpu_quota, cpu_weight
from ssh_helpers import PYTHON, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(300)]

# A fifth of a core for the slow host. Every host's group is favoured by the scheduler over the
# machine's other work, so that on a busy machine of two cores each host still gets what a host of
# its own would (the slow one its fifth, the others a core): the figures differ about five times,
# and the line is under 1/0.54 for two hosts.
QUOTA = 0.2
WEIGHT = 100


@contextlib.contextmanager
def hosts_with_cores(lab_of_three, slow: tuple[str, ...] = ()):
    """Every host's sshd, and so every session it starts from now on, in a cgroup of its own:
    those named in `slow` held to QUOTA of a core."""
    servers = lab_of_three[3]
    with contextlib.ExitStack() as stack:
        for name, server in servers.items():
            group = stack.enter_context(cpu_quota(QUOTA, name, WEIGHT) if name in slow else cpu_weight(WEIGHT, name))
            group.add(server.proc.pid)
        yield


def mgpu_on_lab(lab_of_three, tmp_path, command: str, *args: str) -> subprocess.CompletedProcess:
    """`mgpu COMMAND` on the lab's hosts; a login may wait on a host held to a fraction of a core."""
    return lab_mgpu.run(tmp_path, command, *lab_mgpu.ssh_files(lab_of_three), "--connect-timeout", "30", *args)


def check(lab_of_three, tmp_path, workers: str) -> tuple[dict, str]:
    done = mgpu_on_lab(lab_of_three, tmp_path, "check", "--workers", workers, "--json", "--", PYTHON, "-c", "pass")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), done.stderr


def test_check_names_the_host_held_to_a_fraction_of_a_core_with_its_figures(lab_of_three, tmp_path):
    with hosts_with_cores(lab_of_three, slow=("h2",)):
        report, stderr = check(lab_of_three, tmp_path, "h1:2222,h2:2222")
    h1, h2 = report["hosts"]
    assert report["slow_hosts"] == ["h2"], report
    assert [slow["figure"] for slow in h2["speed"]["slow"]] == ["compute"]
    assert h2["speed"]["cpu_gflops"] < 0.54 * h1["speed"]["cpu_gflops"]
    (warning,) = [line for line in stderr.splitlines() if "warning" in line]
    assert warning.startswith("mgpu: warning: h2 is slow: compute "), stderr
    assert " GFLOP/s (median " in warning


def test_an_even_pair_names_no_one(lab_of_three, tmp_path):
    with hosts_with_cores(lab_of_three):
        report, stderr = check(lab_of_three, tmp_path, "h1:2222,h2:2222")
    assert report["slow_hosts"] == [], report
    assert all(row["speed"]["cpu_gflops"] > 0 for row in report["hosts"])
    assert "warning" not in stderr


# Each task prints the network namespace it runs in: which host it is on.
WHERE = "import os; print('on', os.readlink('/proc/self/ns/net'))"


def launch(lab_of_three, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    """`mgpu launch ARGS` on h1 and h2 with h2 held to QUOTA of a core: (what it printed, run.json, the namespace of worker:1)."""
    run_id = unique_run_id("slow")
    with hosts_with_cores(lab_of_three, slow=("h2",)):
        done = mgpu_on_lab(lab_of_three, tmp_path, "launch", "--workers", "h1:2222,h2:2222", *args, "--workdir",
                    str(tmp_path), "--run-id", run_id, "--start-timeout", "120", "--", PYTHON, "-c", WHERE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = tmp_path / "mgpu-runs" / run_id
    where = next(line for line in (folder / "worker-1.log").read_text().splitlines() if line.startswith("on "))
    return done, json.loads((folder / "run.json").read_text()), where


def test_launch_leaves_out_the_slow_host_for_a_spare(lab_of_three, tmp_path):
    lab = lab_of_three[0]
    done, record, where = launch(lab_of_three, tmp_path, "--spare-hosts", "h3", "--leave-out-slow")
    lines = done.stderr.splitlines()
    assert any(line.startswith("mgpu: warning: h2 is slow: compute ") for line in lines), done.stderr
    assert "mgpu: left out slow host h2: its tasks run on spare host h3" in lines, done.stderr
    assert record["status"] == "succeeded"
    assert [(plan["name"], plan["host"]) for plan in record["plans"]] == [("worker:0", "h1"), ("worker:1", "h3")]
    assert where == f"on net:[{lab.net_inode('h3')}]"


def test_without_a_spare_the_slow_host_is_only_warned_about(lab_of_three, tmp_path):
    lab = lab_of_three[0]
    done, record, where = launch(lab_of_three, tmp_path, "--leave-out-slow")
    lines = done.stderr.splitlines()
    assert any(line.startswith("mgpu: warning: h2 is slow: compute ") for line in lines), done.stderr
    assert ("mgpu: warning: --leave-out-slow: no spare host (--spare-hosts) left to take the tasks of h2; "
            "it runs them") in lines, done.stderr
    assert record["status"] == "succeeded" and where == f"on net:[{lab.net_inode('h2')}]"
