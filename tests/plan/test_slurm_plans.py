"""Plans from a Slurm allocation's variables, and the task side's choices, without a cluster.

(The same code runs against a real Slurm in tests/backends/slurm/.)
"""

import json
import os
import signal

import pytest

from launcher.backends.slurm import srun_argv, step_environment, task_status
from launcher.plan.render import slurm_step_document
from launcher.bootstrap.slurm_task import read_plan_environment, task_start

ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[9-10],gpu01", "SLURM_TASKS_PER_NODE": "2(x2),1"}
NO_SLURM = {name: "" for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                                   "SLURM_TASKS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_PROCID",
                                   "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURMD_NODENAME")}


def plan_json(mgpu, *args, env):
    result = mgpu("launch", "--slurm", *args, "--dry-run", "--json", env={**NO_SLURM, **env})
    assert result.exit_code == 0, result.stderr
    return result.json()["tasks"]


def test_outside_an_allocation_is_one_line_exit_2(mgpu):
    result = mgpu("launch", "--slurm", "--dry-run", env=NO_SLURM)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "mgpu: error: --slurm needs a Slurm allocation (SLURM_JOB_ID is not set): run mgpu inside one, e.g. "
        "`salloc -N 2 --ntasks-per-node 2 mgpu launch --slurm`, or in an sbatch script")


def test_ranks_follow_slurms_node_order(mgpu):
    """node9 before node10, as Slurm ranks them; sorting by name would put node10 first."""
    tasks = plan_json(mgpu, "--port", "5000", env=ALLOCATION)
    assert [(t["host"], t["port"]) for t in tasks] == [
        ("node9", 5000), ("node9", 5001), ("node10", 5000), ("node10", 5001), ("gpu01", 5000)]
    assert tasks[0]["tf_config"]["cluster"]["worker"] == [
        "node9:5000", "node9:5001", "node10:5000", "node10:5001", "gpu01:5000"]
    assert [t["tf_config"]["task"]["index"] for t in tasks] == [0, 1, 2, 3, 4]
    assert not any(t["local"] for t in tasks)
    assert tasks[0]["argv"][1:] == ["-m", "launcher.trainer"]


def test_chief_and_evaluator_take_the_first_and_last_rank(mgpu):
    tasks = plan_json(mgpu, "--chief", "--evaluator", env=ALLOCATION)
    assert [(t["type"], t["index"], t["host"], t["port"]) for t in tasks] == [
        ("chief", 0, "node9", 2222), ("worker", 0, "node9", 2223), ("worker", 1, "node10", 2222),
        ("worker", 2, "node10", 2223), ("evaluator", 0, "gpu01", None)]


def test_text_dry_run_names_the_srun_task(mgpu):
    result = mgpu("launch", "--slurm", "--dry-run", env={**NO_SLURM, **ALLOCATION})
    assert "worker:3  node10:2223  (srun task 3)" in result.stdout


def test_gpus_per_task_from_the_allocation_or_the_option(mgpu):
    tasks = plan_json(mgpu, env={**ALLOCATION, "SLURM_GPUS_PER_TASK": "a100:2"})
    assert [t["env"]["CUDA_VISIBLE_DEVICES"] for t in tasks] == ["0,1", "2,3", "0,1", "2,3", "0,1"]
    tasks = plan_json(mgpu, "--gpus-per-task", "1", env=ALLOCATION)
    assert [t["env"]["CUDA_VISIBLE_DEVICES"] for t in tasks] == ["0", "1", "0", "1", "0"]
    assert all("CUDA_VISIBLE_DEVICES" not in t["env"] for t in plan_json(mgpu, env=ALLOCATION))


@pytest.mark.parametrize("args, env, message", [
    (["--chief", "h0:2222"], ALLOCATION, "with --slurm, --chief takes no value"),
    (["--workers", "h1"], ALLOCATION, "give only one of --workers and --slurm"),
    (["--evaluator"], {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "1"},
     "too few for the evaluator and one training task"),
    ([], {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2"},
     "2 nodes (n[1-2]) but tasks per node for 1 (2)"),
    ([], {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[2-1]"}, "range 2-1 goes backwards"),
])
def test_bad_allocations(mgpu, args, env, message):
    result = mgpu("launch", "--slurm", *args, "--dry-run", env={**NO_SLURM, **env})
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_tf_config_from_slurm_uses_the_step(mgpu):
    step = {**ALLOCATION, "SLURM_STEP_NODELIST": "node10,gpu01", "SLURM_STEP_TASKS_PER_NODE": "2,1",
            "SLURM_PROCID": "2", "SLURMD_NODENAME": "gpu01"}
    result = mgpu("tf-config", "--from-slurm", "--port", "4000", env={**NO_SLURM, **step})
    assert result.exit_code == 0, result.stderr
    assert result.json() == {"cluster": {"worker": ["node10:4000", "node10:4001", "gpu01:4000"]},
                             "task": {"type": "worker", "index": 2}}


@pytest.mark.parametrize("env, message", [
    ({**ALLOCATION, "SLURM_PROCID": "1", "SLURMD_NODENAME": "node10"},
     "task 1 runs on node10, but block distribution puts it on node9"),
    (ALLOCATION, "SLURM_PROCID is not set: run this inside a job step (srun)"),
    ({**ALLOCATION, "SLURM_PROCID": "9"}, "SLURM_PROCID 9 is out of range: the step has 5 tasks"),
    ({}, "--slurm needs a Slurm allocation"),
])
def test_tf_config_from_slurm_errors(mgpu, env, message):
    result = mgpu("tf-config", "--from-slurm", env={**NO_SLURM, **env})
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def slurm_plans(mgpu, *args):
    """TaskPlans as `mgpu launch --slurm` makes them, rebuilt from the dry run's JSON."""
    from launcher.plan.planner import TaskPlan

    return [TaskPlan(type=t["type"], index=t["index"], host=t["host"], port=t["port"], local=False, ssh=None,
                     argv=tuple(t["argv"]), env=t["env"], workdir=None, waits_for_ready=True, slurm_rank=rank)
            for rank, t in enumerate(plan_json(mgpu, *args, env=ALLOCATION))]


def test_task_side_rebuilds_each_plan_exactly(mgpu):
    plans = slurm_plans(mgpu, "--chief", "--env", "A=1", "--gpus-per-task", "1")
    document = json.loads(json.dumps(slurm_step_document(plans)))
    for rank, plan in enumerate(plans):
        argv, env, workdir = task_start(document, rank, {"PATH": "/bin", "SLURM_PROCID": str(rank)})
        assert argv == list(plan.argv) and workdir is None
        assert {k: env[k] for k in plan.env} == dict(plan.env)  # TF_CONFIG byte for byte
        assert env["PATH"] == "/bin"


def test_task_side_keeps_the_gpus_slurm_bound(mgpu):
    plans = slurm_plans(mgpu, "--gpus-per-task", "1")
    document = slurm_step_document(plans)
    _, env, _ = task_start(document, 1, {"CUDA_VISIBLE_DEVICES": "3"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # Slurm's binding, where the plan says "1"
    _, env, _ = task_start(document, 1, {})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_plan_of_a_thousand_tasks_travels_in_the_environment(mgpu):
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu-node-[0001-0128]", "SLURM_TASKS_PER_NODE": "8(x128)"}
    result = mgpu("launch", "--slurm", "--dry-run", "--json", "--gpus-per-task", "1", env={**NO_SLURM, **env})
    from launcher.plan.planner import TaskPlan

    plans = [TaskPlan(type=t["type"], index=t["index"], host=t["host"], port=t["port"], local=False, ssh=None,
                      argv=tuple(t["argv"]), env=t["env"], workdir=None, waits_for_ready=True, slurm_rank=rank)
             for rank, t in enumerate(result.json()["tasks"])]
    assert len(plans) == 1024
    step_env = step_environment(plans, {"CUDA_VISIBLE_DEVICES": "0", "HOME": "/root"})
    assert "CUDA_VISIBLE_DEVICES" not in step_env and step_env["HOME"] == "/root"
    assert max(len(value) for value in step_env.values()) < 128 * 1024  # Linux's limit for one string
    _, task_env, _ = task_start(read_plan_environment(step_env), 1023, step_env)
    assert task_env["TF_CONFIG"] == plans[1023].env["TF_CONFIG"]
    assert task_env["CUDA_VISIBLE_DEVICES"] == "7"
    assert not any(name.startswith("MGPU_SLURM_PLAN") for name in task_env)


@pytest.mark.parametrize("text, status", [
    ("Completed", 0), ("Exited with exit code 3", 3), ("Killed", -signal.SIGKILL), ("Terminated", -signal.SIGTERM),
    ("Segmentation fault", -signal.SIGSEGV), ("something new", None),
])
def test_srun_task_status_wording(text, status):
    assert task_status(text) == status


def test_srun_guards_fail_fast_only_without_a_sidecar(mgpu):
    plans = slurm_plans(mgpu)
    assert "--kill-on-bad-exit=1" in srun_argv(plans, "python3")
    assert "--ntasks=5" in srun_argv(plans, "python3") and "--nodes=3" in srun_argv(plans, "python3")
    with_evaluator = slurm_plans(mgpu, "--evaluator")
    assert "--kill-on-bad-exit=0" in srun_argv(with_evaluator, "python3")


def test_spare_hosts_are_nodes_of_the_allocation_that_no_task_uses(mgpu):
    tasks = plan_json(mgpu, "--port", "5000", "--spare-hosts", "node10", env=ALLOCATION)
    assert [(t["type"], t["index"], t["host"]) for t in tasks] == [
        ("worker", 0, "node9"), ("worker", 1, "node9"), ("worker", 2, "gpu01")]
    text = mgpu("launch", "--slurm", "--spare-hosts", "node10", "--dry-run", env={**NO_SLURM, **ALLOCATION})
    assert "spare hosts: node10" in text.stdout
    result = mgpu("launch", "--slurm", "--spare-hosts", "node11", "--dry-run", env={**NO_SLURM, **ALLOCATION})
    assert result.exit_code == 2
    assert "spare host node11 is not a node of Slurm job 77 (node9, node10, gpu01)" in result.stderr


def test_a_node_left_out_gives_its_tasks_to_a_spare_node_and_the_step_excludes_it(monkeypatch, tmp_path):
    """The spare comes first in the allocation, so the tasks it takes get the first ranks: block
    layout puts them there. The tasks keep their types and indices."""
    from launcher.cli.options import HostNaming
    from launcher.config.slurm_env import read_allocation
    from launcher.intake.load import HostsRequest, SlurmScope, make_plans, read_spec
    from launcher.fleet.fleet import SlurmFleet
    from launcher.launch_options import LaunchOptions
    from launcher.supervise.options import SuperviseOptions

    allocation = {"SLURM_JOB_ID": "78", "SLURM_JOB_NODELIST": "a,b,c", "SLURM_TASKS_PER_NODE": "1(x3)"}
    for name, value in {**NO_SLURM, **allocation}.items():
        monkeypatch.setenv(name, value)
    spec = read_spec(HostsRequest(slurm=SlurmScope.ALLOCATION, spares=("a",)))
    replan = lambda changed: make_plans(changed, "r1", HostNaming(), slurm=True)  # noqa: E731
    plans = replan(spec)
    nodes = read_allocation(os.environ).nodes
    assert [(p.name, p.host, p.slurm_rank) for p in plans] == [("worker:0", "b", 0), ("worker:1", "c", 1)]
    assert "--exclude=a" in srun_argv(plans, "python3", nodes) and "--nodes=2" in srun_argv(plans, "python3", nodes)

    actions = SlurmFleet(plans, LaunchOptions(SuperviseOptions(run_id="r1", log_dir=tmp_path), spec=spec, replan=replan),
                         nodes)
    placement = actions.replace(["c"], print)
    replaced, [(_, spare)] = placement.plans, placement.took
    assert spare == "a"
    assert [(p.name, p.host, p.slurm_rank) for p in replaced] == [("worker:1", "a", 0), ("worker:0", "b", 1)]
    assert json.loads(replaced[0].env["TF_CONFIG"])["cluster"]["worker"] == ["b:2222", "a:2222"]
    argv = srun_argv(replaced, "python3", nodes)
    assert "--exclude=c" in argv and "--nodes=2" in argv
    # No spare left: the run stops, naming the node.
    assert actions.replace(["b"], print).plans is None
