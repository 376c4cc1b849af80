"""Spare hosts on the command line and in spec files, the dry run, and the relaunch command without a lost host."""

import dataclasses

import pytest

from launcher.config.spec import ClusterSpec, TaskSpec, with_host_replaced
from launcher.config.spec_file import load_spec_text
from launcher.errors import SpecError
from launcher.fleet.relaunch import relaunch_command
from launching import run_mgpu


def test_the_dry_run_shows_the_spares():
    done = run_mgpu("launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h5,h6", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "spare hosts: h5, h6 (each takes the tasks of a host left out)"


def test_a_spare_that_runs_a_task_is_bad_input():
    done = run_mgpu("launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h2", "--dry-run")
    assert done.returncode == 2
    assert done.stderr.strip() == "mgpu: error: spare host h2 already runs a task; a spare must be a host the run does not use"


def test_spec_files_list_spares():
    spec = load_spec_text("cluster:\n  worker: [h1:2222, h2:2222]\nspares: [h5, h6]\n", "c.yaml")
    assert spec.spares == ("h5", "h6")
    with pytest.raises(SpecError, match="spares: a host is listed twice"):
        load_spec_text("cluster:\n  worker: [h1:2222]\nspares: [h5, h5]\n", "c.yaml")


def test_a_spare_takes_the_tasks_of_the_host_it_replaces():
    spec = ClusterSpec(tasks=(TaskSpec("worker", "h1", 2222), TaskSpec("worker", "h2", 2222),
                              TaskSpec("worker", "h2", 2223)), spares=("h5", "h6"))
    changed = with_host_replaced(spec, "h2", "h5")
    assert [(t.host, t.port) for t in changed.tasks] == [("h1", 2222), ("h5", 2222), ("h5", 2223)]
    assert changed.spares == ("h6",)
    assert dataclasses.replace(changed, tasks=spec.tasks, spares=spec.spares) == spec


def test_the_relaunch_command_leaves_the_lost_host_out():
    argv = ["launch", "--workers", "h1:2222,u@h2:2222,h3:2222", "--run-id", "r1", "--max-restarts", "2",
            "--chief=h2:2000", "--", "python", "train.py", "--workers", "h2"]
    assert relaunch_command(argv, "h2") == (
        "mgpu launch --workers h1:2222,h3:2222 --max-restarts 2 -- python train.py --workers h2")
    assert relaunch_command(["launch", "--hostfile", "hosts.txt"], "h2") == (
        "mgpu launch --hostfile hosts.txt  (after removing h2 from hosts.txt)")


@pytest.mark.parametrize("without", ["--no-check", "--slurm"])
def test_leaving_out_slow_hosts_needs_the_checks(without):
    done = run_mgpu("launch", "--workers", "h1:2222,h2:2222", "--spare-hosts", "h5", "--leave-out-slow", without,
                    "--dry-run")
    assert done.returncode == 2
    assert done.stderr.strip() == ("mgpu: error: --leave-out-slow needs the speed probe of the pre-launch checks: "
                                   f"not with {without}")


def test_the_relaunch_command_names_no_host_found_lost():
    argv = ["launch", "--workers", "h1:2222,h2:2222,h3:2222", "--spare-hosts", "h4,h5", "--", "python", "train.py"]
    assert relaunch_command(argv, ("h1", "h2", "h4")) == (
        "mgpu launch --workers h3:2222 --spare-hosts h5 -- python train.py")
    assert relaunch_command(["launch", "--hostfile", "hosts.txt"], ("h1", "h2")) == (
        "mgpu launch --hostfile hosts.txt  (after removing h1, h2 from hosts.txt)")
