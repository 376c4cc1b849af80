"""Each member's environment beside TF_CONFIG for PyTorch: ranks, the master and the rest of torchrun's contract."""

import pytest
from job_env_helpers import ALLOCATION, SLURM_VARIABLES, TORCH_NAMES, dry_run_tasks, exported, pod_environment


def torch_env(task):
    return {name: task["env"][name] for name in TORCH_NAMES if name in task["env"]}


def test_workers_in_order_worker_0_is_the_master(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "h1:2300,h2:2222,h3")
    assert [torch_env(task) for task in tasks] == [
        {"RANK": str(i), "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
         "MASTER_ADDR": "h1", "MASTER_PORT": "2300"} for i in range(3)]


def test_the_chief_is_rank_0_and_the_evaluator_gets_nothing(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "h1:2222,h2:2222", "--chief", "h0:2400", "--evaluator", "h9")
    assert [(t["type"], t["env"].get("RANK")) for t in tasks] == [
        ("chief", "0"), ("worker", "1"), ("worker", "2"), ("evaluator", None)]
    assert {(t["env"]["MASTER_ADDR"], t["env"]["MASTER_PORT"], t["env"]["WORLD_SIZE"]) for t in tasks[:3]} == {
        ("h0", "2400", "3")}
    assert torch_env(tasks[3]) == {}


def test_master_is_the_first_tf_config_address(mgpu):
    tasks = dry_run_tasks(mgpu, "--local", "2", "--chief")
    first = tasks[0]["tf_config"]["cluster"]["chief"][0]
    assert {f"{t['env']['MASTER_ADDR']}:{t['env']['MASTER_PORT']}" for t in tasks} == {first}


def test_local_ranks_count_the_members_of_each_host(mgpu):
    """Slots on one host are numbered from 0 there; the evaluator on a host takes no local rank."""
    tasks = dry_run_tasks(mgpu, "--hosts", "a:3,b:2", "--evaluator", "a")
    assert [(t["host"], t["env"].get("LOCAL_RANK"), t["env"].get("LOCAL_WORLD_SIZE")) for t in tasks] == [
        ("a", "0", "3"), ("a", "1", "3"), ("a", "2", "3"), ("b", "0", "2"), ("b", "1", "2"), ("a", None, None)]
    assert [t["env"].get("RANK") for t in tasks] == ["0", "1", "2", "3", "4", None]


def test_ipv6_master_addr_has_no_brackets(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "[fd00::1]:2222,[fd00::2]:2222")
    assert (tasks[1]["env"]["MASTER_ADDR"], tasks[1]["env"]["MASTER_PORT"]) == ("fd00::1", "2222")


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_torch_names_are_reserved(mgpu, tmp_path, name):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"cluster: {{worker: [h1:2222]}}\nenv: {{{name}: '1'}}\n")
    result = mgpu("launch", "--spec", str(spec), "--dry-run")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"mgpu: error: environment variable {name} is set by mgpu for each task and cannot be given"
    result = mgpu("launch", "--workers", "h1", "--env", f"{name}=1", "--dry-run")
    assert result.exit_code == 2 and "is set by mgpu for each task" in result.stderr


def test_text_dry_run_shows_the_torch_variables(mgpu):
    result = mgpu("launch", "--workers", "h1:2222,h2:2222", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "MASTER_ADDR=h1" in result.stdout and "MASTER_PORT=2222" in result.stdout
    assert "WORLD_SIZE=2" in result.stdout and "RANK=1" in result.stdout


def test_tf_config_torch_env_format_exports_them(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--chief", "h0:2500", "--task-index", "1",
                  "--format", "torch-env")
    assert result.exit_code == 0, result.stderr
    assert exported(result.stdout, TORCH_NAMES) == {
        "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "h0", "MASTER_PORT": "2500"}
    result = mgpu("tf-config", "--workers", "h1:2222", "--evaluator", "h9", "--task-type", "evaluator",
                  "--task-index", "0", "--format", "torch-env")
    assert result.exit_code == 0 and result.stdout.strip() == ""


def test_slurm_step_tasks_get_them_from_the_plan(mgpu):
    """Inside the srun step each task takes its own RANK and LOCAL_RANK from the plan's document."""
    from launcher.plan.planner import TaskPlan
    from launcher.backends.slurm import step_environment
    from launcher.bootstrap.slurm_task import read_plan_environment, task_start

    env = {**{name: "" for name in SLURM_VARIABLES}, **ALLOCATION}
    tasks = dry_run_tasks(mgpu, "--slurm", "--port", "5000", "--evaluator", "--gpus-per-task", "0", env=env)
    plans = [TaskPlan(type=t["type"], index=t["index"], host=t["host"], port=t["port"], local=False, ssh=None,
                      argv=tuple(t["argv"]), env=t["env"], workdir=None, waits_for_ready=True, slurm_rank=rank)
             for rank, t in enumerate(tasks)]
    document = read_plan_environment(step_environment(plans, {"HOME": "/root", "RANK": "stale"}))
    started = [torch_env({"env": task_start(document, rank, {"RANK": "stale"})[1]}) for rank in range(len(plans))]
    assert started[:3] == [
        {"RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": size,
         "MASTER_ADDR": "node1", "MASTER_PORT": "5000"}
        for rank, local, size in ((0, 0, "2"), (1, 1, "2"), (2, 0, "1"))]
    assert started[3] == {}  # the evaluator (node2's second Slurm task): not a member
    assert [t["type"] for t in tasks] == ["worker", "worker", "worker", "evaluator"]


def test_planning_stays_linear(mgpu):
    """Every task shares the strings of the job: the plan of 4096 tasks holds one MASTER_ADDR."""
    from launcher.config.spec import ClusterSpec, TaskSpec
    from launcher.plan.planner import plan_tasks

    spec = ClusterSpec(tasks=tuple(TaskSpec(role="worker", host=f"node{i // 8}", port=2222 + i % 8) for i in range(4096)))
    plans = plan_tasks(spec, run_id="r", local_hosts=frozenset(), launcher_python="python3")
    assert len({id(plan.env["MASTER_ADDR"]) for plan in plans}) == 1
    assert len({id(plan.env["WORLD_SIZE"]) for plan in plans}) == 1
    assert plans[4095].env["LOCAL_RANK"] == "7" and plans[4095].env["RANK"] == "4095"


# -- The rest of torchrun's contract ----------------------------------------------------------

ELASTIC_NAMES = ("GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def elastic_env(task):
    return {name: task["env"][name] for name in ELASTIC_NAMES if name in task["env"]}


def test_hosts_are_torchruns_nodes_and_the_run_is_its_run(mgpu):
    """A host is one torchrun node, numbered in the order of its first member; one role, "default", holds every
    member; the run id and --max-restarts are torchelastic's; the evaluator is outside the job."""
    tasks = dry_run_tasks(mgpu, "--hosts", "b:1,a:2", "--chief", "a:2400", "--evaluator", "a",
                          "--run-id", "run-7", "--max-restarts", "3")
    assert [(t["type"], t["host"]) for t in tasks] == [("chief", "a"), ("worker", "b"), ("worker", "a"),
                                                       ("worker", "a"), ("evaluator", "a")]
    assert [elastic_env(t) for t in tasks[:4]] == [
        {"GROUP_RANK": group, "GROUP_WORLD_SIZE": "2", "NODE_RANK": group, "ROLE_NAME": "default",
         "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "run-7",
         "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3"}
        for rank, group in enumerate(("0", "1", "0", "0"))]
    assert elastic_env(tasks[4]) == {}


def test_omp_threads_as_torchrun_sets_them(mgpu):
    """OMP_NUM_THREADS=1 where a host runs several members (torchrun's rule), unless the user set it."""
    tasks = dry_run_tasks(mgpu, "--hosts", "a:2,b:1")
    assert [t["env"].get("OMP_NUM_THREADS") for t in tasks] == ["1", "1", None]
    tasks = dry_run_tasks(mgpu, "--hosts", "a:2", "--env", "OMP_NUM_THREADS=4", "--show-secrets")
    assert [t["env"]["OMP_NUM_THREADS"] for t in tasks] == ["4", "4"]
    tasks = dry_run_tasks(mgpu, "--hosts", "a:2", "--threads-per-task", "3")
    assert [t["env"]["OMP_NUM_THREADS"] for t in tasks] == ["3", "3"]


@pytest.mark.parametrize("name", ("GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"))
def test_torchruns_names_are_reserved(mgpu, name):
    result = mgpu("launch", "--workers", "h1", "--env", f"{name}=1", "--dry-run")
    assert result.exit_code == 2 and f"environment variable {name} is set by mgpu" in result.stderr


def test_text_dry_run_and_torch_env_format_show_torchruns_names(mgpu):
    result = mgpu("launch", "--workers", "h1:2222,h2:2222", "--run-id", "r9", "--dry-run")
    assert "TORCHELASTIC_RUN_ID=r9" in result.stdout and "GROUP_RANK=1" in result.stdout
    result = mgpu("tf-config", "--workers", "h1:2222,h1:2223,h2:2222", "--task-index", "2", "--format", "torch-env")
    assert result.exit_code == 0, result.stderr
    exports = exported(result.stdout, ELASTIC_NAMES)
    assert {name: exports[name] for name in ("GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK")} == {
        "GROUP_RANK": "1", "NODE_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "2"}


def test_a_slurm_task_takes_its_restart_count_from_the_attempt(mgpu):
    """The plan holds the first attempt's count; srun's environment carries the attempt of each step."""
    from launcher.plan.planner import TaskPlan
    from launcher.backends.slurm import step_environment
    from launcher.bootstrap.slurm_task import read_plan_environment, task_start

    env = {**{name: "" for name in SLURM_VARIABLES}, **ALLOCATION}
    tasks = dry_run_tasks(mgpu, "--slurm", "--port", "5000", "--gpus-per-task", "0", "--max-restarts", "2", env=env)
    plans = [TaskPlan(type=t["type"], index=t["index"], host=t["host"], port=t["port"], local=False, ssh=None,
                      argv=tuple(t["argv"]), env=t["env"], workdir=None, waits_for_ready=True, slurm_rank=rank)
             for rank, t in enumerate(tasks)]
    document = read_plan_environment(step_environment(plans, {"HOME": "/root"}))
    started = [task_start(document, rank, {"MGPU_ATTEMPT": "2"})[1] for rank in range(len(plans))]
    assert [(e["GROUP_RANK"], e["TORCHELASTIC_RESTART_COUNT"], e["TORCHELASTIC_MAX_RESTARTS"]) for e in started] == [
        ("0", "2", "2"), ("0", "2", "2"), ("1", "2", "2"), ("1", "2", "2")]


def test_a_k8s_pod_is_its_own_torchrun_node(mgpu):
    env = pod_environment(mgpu, "--workers", "3", "--name", "run8", index=2)
    result = mgpu("tf-config", "--from-k8s", "--format", "torch-env", env=env)
    assert result.exit_code == 0, result.stderr
    exports = exported(result.stdout, ELASTIC_NAMES)
    assert (exports["GROUP_RANK"], exports["GROUP_WORLD_SIZE"], exports["TORCHELASTIC_RUN_ID"]) == ("2", "3", "run8")
