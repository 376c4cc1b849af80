"""Shared by the job environment's tests: a dry run's tasks, shell exports read back, Slurm's variables, a pod's env."""

import subprocess

SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE",
                   "SLURM_GPUS_PER_TASK", "SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                   "SLURMD_NODENAME")
ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}

TORCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def dry_run_tasks(mgpu, *args, env=None):
    result = mgpu("launch", *args, "--dry-run", "--json", env=env)
    assert result.exit_code == 0, result.stderr
    return result.json()["tasks"]


def exported(shell_lines: str, names) -> dict:
    script = shell_lines + "\n" + "".join(f'printf "%s\\n" "${{{name}-unset}}"\n' for name in names)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10, check=True).stdout
    return dict(zip(names, out.splitlines()))


def pod_environment(mgpu, *k8s_args, index):
    """The environment a pod of the manifest gets: its container's env, and Kubernetes' index."""
    import yaml

    result = mgpu("k8s", *k8s_args, "--image", "registry.example.com/train:1")
    assert result.exit_code == 0, result.stderr
    [job] = [doc for doc in yaml.safe_load_all(result.stdout) if doc["kind"] == "Job"]
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    return {**env, "JOB_COMPLETION_INDEX": str(index)}
