"""Each member's environment beside TF_CONFIG for Keras 3 and JAX (CPU collectives too), planned and from tf-config."""

import pytest
from job_env_helpers import ALLOCATION, SLURM_VARIABLES, TORCH_NAMES, dry_run_tasks, exported, pod_environment
from needs import require

KERAS_NAMES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
COLLECTIVES = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"


def keras_env(task):
    return {name: task["env"][name] for name in KERAS_NAMES if name in task["env"]}


def test_workers_in_order_worker_0_coordinates(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "h1:2222,h2:2300,h3")
    assert [keras_env(task) for task in tasks] == [
        {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "h1:2222,h2:2300,h3:2222",
         "KERAS_DISTRIBUTION_NUM_PROCESSES": "3", "KERAS_DISTRIBUTION_PROCESS_ID": str(i)}
        for i in range(3)]


def test_the_chief_is_process_0_and_the_evaluator_is_not_in_the_job(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "h1:2222,h2:2222", "--chief", "h0:2222", "--evaluator", "h9")
    assert [(t["type"], t["index"], t["env"].get("KERAS_DISTRIBUTION_PROCESS_ID")) for t in tasks] == [
        ("chief", 0, "0"), ("worker", 0, "1"), ("worker", 1, "2"), ("evaluator", 0, None)]
    assert tasks[0]["env"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "h0:2222,h1:2222,h2:2222"
    assert {t["env"]["KERAS_DISTRIBUTION_NUM_PROCESSES"] for t in tasks[:3]} == {"3"}
    assert keras_env(tasks[3]) == {} and COLLECTIVES not in tasks[3]["env"]


def test_job_addresses_are_the_tf_config_addresses(mgpu):
    """Both routes name the same hosts and ports: whatever TF_CONFIG holds, so do the job addresses."""
    tasks = dry_run_tasks(mgpu, "--local", "2", "--chief")
    cluster = tasks[0]["tf_config"]["cluster"]
    assert tasks[0]["env"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == ",".join(cluster["chief"] + cluster["worker"])


def test_ipv6_addresses_keep_their_brackets(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "[fd00::1]:2222,[fd00::2]:2222")
    assert tasks[1]["env"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "[fd00::1]:2222,[fd00::2]:2222"


def test_tasks_without_gpus_get_gloo(mgpu, gpus_on_path):
    no_gpus = gpus_on_path(0)
    tasks = dry_run_tasks(mgpu, "--local", "2", env=no_gpus)
    assert [task["env"].get(COLLECTIVES) for task in tasks] == ["gloo", "gloo"]
    tasks = dry_run_tasks(mgpu, "--workers", "h1,h2", "--gpus-per-task", "0", env=no_gpus)
    assert [task["env"].get(COLLECTIVES) for task in tasks] == ["gloo", "gloo"]


def test_tasks_with_gpus_or_uncounted_gpus_keep_jax_default(mgpu, gpus_on_path):
    tasks = dry_run_tasks(mgpu, "--local", "2", env=gpus_on_path(2))
    assert [task["env"].get("CUDA_VISIBLE_DEVICES") for task in tasks] == ["0", "1"]
    assert [task["env"].get(COLLECTIVES) for task in tasks] == [None, None]
    # A remote host's GPUs are not counted at planning time: CUDA_VISIBLE_DEVICES and JAX are left alone.
    tasks = dry_run_tasks(mgpu, "--workers", "h1,h2", env=gpus_on_path(3))
    assert [task["env"].get(COLLECTIVES) for task in tasks] == [None, None]


def test_the_users_collectives_win(mgpu, gpus_on_path):
    tasks = dry_run_tasks(mgpu, "--local", "2", "--env", f"{COLLECTIVES}=mpi", "--show-secrets", env=gpus_on_path(0))
    assert [task["env"][COLLECTIVES] for task in tasks] == ["mpi", "mpi"]


@pytest.mark.parametrize("name", KERAS_NAMES)
def test_keras_names_are_reserved_in_spec_files(mgpu, tmp_path, name):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"cluster: {{worker: [h1:2222]}}\nenv: {{{name}: '1'}}\n")
    result = mgpu("launch", "--spec", str(spec), "--dry-run")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"mgpu: error: environment variable {name} is set by mgpu for each task and cannot be given"


def test_text_dry_run_shows_the_keras_variables(mgpu):
    result = mgpu("launch", "--workers", "h1:2222,h2:2222", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "KERAS_DISTRIBUTION_JOB_ADDRESSES=h1:2222,h2:2222" in result.stdout
    assert "KERAS_DISTRIBUTION_PROCESS_ID=1" in result.stdout


def test_tf_config_keras_env_format_exports_the_keras_variables(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--chief", "h0:2222", "--task-index", "1",
                  "--format", "keras-env")
    assert result.exit_code == 0, result.stderr
    assert exported(result.stdout, KERAS_NAMES) == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h0:2222,h1:2222,h2:2222",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
        "KERAS_DISTRIBUTION_PROCESS_ID": "2",
    }


def test_tf_config_keras_env_format_gives_the_evaluator_nothing(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222", "--evaluator", "h9", "--task-type", "evaluator",
                  "--task-index", "0", "--format", "keras-env")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == ""


def test_tf_config_env_format_stays_one_line_of_tf_config(mgpu):
    """Scripts read it as one line per task (srun --label, say): the Keras variables have their own format."""
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1", "--format", "env")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 1 and result.stdout.startswith("export TF_CONFIG=")


def test_slurm_tasks_get_the_same_variables(mgpu):
    """Rank r of the srun step is process r of the job (the chief first), as in TF_CONFIG."""
    env = {**{name: "" for name in SLURM_VARIABLES}, **ALLOCATION}
    tasks = dry_run_tasks(mgpu, "--slurm", "--port", "5000", "--chief", "--gpus-per-task", "0", env=env)
    assert [task["env"]["KERAS_DISTRIBUTION_PROCESS_ID"] for task in tasks] == ["0", "1", "2", "3"]
    assert {task["env"]["KERAS_DISTRIBUTION_JOB_ADDRESSES"] for task in tasks} == {
        "node1:5000,node1:5001,node2:5000,node2:5001"}
    assert {task["env"][COLLECTIVES] for task in tasks} == {"gloo"}


def test_tf_config_from_slurm_exports_the_keras_variables(mgpu):
    step = {**{name: "" for name in SLURM_VARIABLES}, "SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1", "SLURMD_NODENAME": "node2"}
    result = mgpu("tf-config", "--from-slurm", "--port", "4000", "--format", "keras-env", env=step)
    assert result.exit_code == 0, result.stderr
    assert exported(result.stdout, KERAS_NAMES) == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "node1:4000,node2:4000",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
    }


def test_a_thousand_slurm_tasks_with_an_evaluator_still_fit_in_the_environment(mgpu):
    """The job addresses are shared by every task but the evaluator: written once, not per task."""
    from launcher.plan.planner import TaskPlan
    from launcher.backends.slurm import step_environment
    from launcher.bootstrap.slurm_task import read_plan_environment, task_start

    env = {**{name: "" for name in SLURM_VARIABLES}, "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "gpu-node-[0001-0128]", "SLURM_TASKS_PER_NODE": "8(x128)"}
    tasks = dry_run_tasks(mgpu, "--slurm", "--evaluator", "--gpus-per-task", "1", env=env)
    plans = [TaskPlan(type=t["type"], index=t["index"], host=t["host"], port=t["port"], local=False, ssh=None,
                      argv=tuple(t["argv"]), env=t["env"], workdir=None, waits_for_ready=True, slurm_rank=rank)
             for rank, t in enumerate(tasks)]
    step_env = step_environment(plans, {"HOME": "/root"})
    assert sum(len(name) + len(value) for name, value in step_env.items()) < 1024 * 1024
    document = read_plan_environment(step_env)
    for rank in (0, 1022, 1023):
        _, task_env, _ = task_start(document, rank, step_env)
        assert keras_env({"env": task_env}) == keras_env({"env": plans[rank].env})
    assert plans[1023].type == "evaluator" and keras_env({"env": plans[1023].env}) == {}


# -- JAX --------------------------------------------------------------------------------------

JAX_NAMES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def jax_env(task):
    return {name: task["env"][name] for name in JAX_NAMES if name in task["env"]}


def test_jax_variables_follow_the_job(mgpu):
    tasks = dry_run_tasks(mgpu, "--workers", "h1:2222,[fd00::2]:2300", "--chief", "[fd00::9]:2400", "--evaluator", "h9")
    assert [jax_env(task) for task in tasks] == [
        {"JAX_COORDINATOR_ADDRESS": "[fd00::9]:2400", "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": str(i)}
        for i in range(3)] + [{}]


@pytest.mark.parametrize("name", JAX_NAMES)
def test_jax_names_are_reserved(mgpu, name):
    result = mgpu("launch", "--workers", "h1", "--env", f"{name}=1", "--dry-run")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"mgpu: error: environment variable {name} is set by mgpu for each task and cannot be given"


def test_tf_config_jax_env_format_exports_them(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1", "--format", "jax-env")
    assert result.exit_code == 0, result.stderr
    assert exported(result.stdout, JAX_NAMES) == {
        "JAX_COORDINATOR_ADDRESS": "h1:2222", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}


def test_installed_jax_reads_the_coordinator_address_itself():
    """jax.distributed.initialize() takes JAX_COORDINATOR_ADDRESS from the environment; the process count
    and id it does not, which is why the docs' recipe passes them in."""
    import inspect

    require("jax")
    from jax._src import distributed

    source = inspect.getsource(distributed.State.initialize)
    assert "os.environ.get('JAX_COORDINATOR_ADDRESS')" in source
    assert "JAX_NUM_PROCESSES" not in source and "JAX_PROCESS_ID" not in source


def test_chief_and_evaluator_help_names_the_options_of_each_command(mgpu):
    """`--chief` takes no value with --local or --slurm (launch) and --from-slurm (tf-config); check has neither."""
    launch, tf_config, check = (mgpu(command, "--help").stdout for command in ("launch", "tf-config", "check"))
    assert "With --local or --slurm, no value." in " ".join(launch.split())
    assert "With --from-slurm, no value." in " ".join(tf_config.split()) and "--local" not in tf_config
    assert "no value" not in check and "--local" not in check
    result = mgpu("check", "--workers", "h1", "--chief")
    assert result.exit_code == 2 and "requires an argument" in result.stderr


def test_tf_config_from_slurm_exports_torch_and_jax_variables(mgpu):
    step = {**{name: "" for name in SLURM_VARIABLES}, "SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3", "SLURMD_NODENAME": "node2"}
    result = mgpu("tf-config", "--from-slurm", "--port", "4000", "--format", "torch-env", env=step)
    assert result.exit_code == 0, result.stderr
    assert exported(result.stdout, TORCH_NAMES) == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node1", "MASTER_PORT": "4000"}
    result = mgpu("tf-config", "--from-slurm", "--port", "4000", "--format", "jax-env", env=step)
    assert exported(result.stdout, JAX_NAMES) == {
        "JAX_COORDINATOR_ADDRESS": "node1:4000", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}


# -- Inside a pod of `mgpu k8s` ---------------------------------------------------------------

def test_tf_config_from_k8s_gives_a_pod_its_place_in_the_job(mgpu):
    """Pod 2 of a job with a chief is worker 1, process 2 of 3; process 0, the chief, coordinates."""
    env = pod_environment(mgpu, "--workers", "2", "--chief", "--name", "run7", index=2)
    result = mgpu("tf-config", "--from-k8s", env=env)
    assert result.exit_code == 0, result.stderr
    tf_config = result.json()
    assert tf_config["task"] == {"type": "worker", "index": 1}
    chief = tf_config["cluster"]["chief"]
    assert len(chief) == 1 and len(tf_config["cluster"]["worker"]) == 2
    assert all(address.startswith("run7-") for address in chief + tf_config["cluster"]["worker"])
    host, port = chief[0].rsplit(":", 1)
    result = mgpu("tf-config", "--from-k8s", "--format", "torch-env", env=env)
    assert result.exit_code == 0, result.stderr
    assert exported(result.stdout, TORCH_NAMES) == {
        "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": host,
        "MASTER_PORT": port}
    result = mgpu("tf-config", "--from-k8s", "--format", "jax-env", env=env)
    assert exported(result.stdout, JAX_NAMES) == {
        "JAX_COORDINATOR_ADDRESS": chief[0], "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": "2"}


def test_tf_config_from_k8s_outside_a_pod_says_what_is_missing(mgpu):
    result = mgpu("tf-config", "--from-k8s", env={"JOB_COMPLETION_INDEX": None, "MGPU_K8S_JOB": None})
    assert result.exit_code == 2
    assert "not in a pod of an `mgpu k8s` job" in result.stderr and "JOB_COMPLETION_INDEX" in result.stderr
    result = mgpu("tf-config", "--from-k8s", "--task-index", "1", env=pod_environment(mgpu, "--workers", "2", index=0))
    assert result.exit_code == 2
    assert "--from-k8s takes the cluster from the pod's environment: drop --task-index" in result.stderr
