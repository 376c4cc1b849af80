"""Planning: a cluster spec becomes one TaskPlan per task. Pure functions, no I/O.

Dry-run renders the plan; launch executes the same plan.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import shlex
from typing import Mapping, Sequence

from launcher.errors import SpecError
from launcher.gpus import assign_visible_devices
from launcher.params import format_address
from launcher.protocol import ENV_RUN_ID, ENV_TASK_INDEX, ENV_TASK_TYPE
from launcher.spec import EVALUATOR, ClusterSpec, SshSettings, TaskSpec


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """Everything needed to start one task, on this machine or over SSH."""

    type: str  # chief | worker | evaluator
    index: int
    host: str
    port: int | None  # None for the evaluator, which is not in the cluster
    local: bool
    ssh: SshSettings | None  # None for a local task
    argv: tuple[str, ...]
    env: Mapping[str, str]  # what the launcher adds to the base environment, TF_CONFIG included
    workdir: str | None
    waits_for_ready: bool  # True when the program speaks the readiness protocol

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def tf_config(self) -> dict:
        return json.loads(self.env["TF_CONFIG"])


TRAINER_MODULE = "launcher.trainer"
REMOTE_PYTHON = "python3"
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> dict:
    """TF_CONFIG for one task. The evaluator is not in `cluster` but still has a task entry."""
    return {"cluster": {role: list(addresses) for role, addresses in cluster.items()},
            "task": {"type": task_type, "index": task_index}}


def cluster_addresses(tasks: Sequence[TaskSpec]) -> dict[str, list[str]]:
    """The TF cluster: chief and worker addresses, in order. The evaluator is not a member."""
    cluster: dict[str, list[str]] = {}
    for task in tasks:
        if task.role != EVALUATOR:
            cluster.setdefault(task.role, []).append(format_address(task.host, task.port))
    return cluster


def task_names(tasks: Sequence[TaskSpec]) -> list[tuple[str, int]]:
    """(type, index) of each task, numbering each role from 0."""
    counts: dict[str, int] = {}
    names = []
    for task in tasks:
        names.append((task.role, counts.get(task.role, 0)))
        counts[task.role] = counts.get(task.role, 0) + 1
    return names


def plan_tasks(
    spec: ClusterSpec,
    *,
    run_id: str,
    local_hosts: frozenset[str],
    launcher_python: str,
    local_gpu_count: int = 0,
) -> list[TaskPlan]:
    """One TaskPlan per task, in order: chief, workers, evaluator.

    `local_hosts` are the host names that mean this machine; their tasks run as local processes.
    `local_gpu_count` is the number of GPUs on this machine.
    """
    for name in spec.env:
        if name == "TF_CONFIG" or name.startswith("MGPU_"):
            raise SpecError(f"environment variable {name} is set by mgpu for each task and cannot be given")
    is_local = [task.host in local_hosts or is_loopback(task.host) for task in spec.tasks]
    loopback = [task.host for task in spec.tasks if is_loopback(task.host)]
    remote = [task.host for task, local in zip(spec.tasks, is_local) if not local]
    if loopback and remote:
        raise SpecError(
            f"loopback address {loopback[0]} is mixed with remote host {remote[0]}: remote tasks would "
            f"dial their own loopback and hang; use an address the other hosts can reach"
        )

    # Tasks on one machine split its GPUs; every local task shares this machine's.
    machine_of = ["" if local else task.host for task, local in zip(spec.tasks, is_local)]
    devices_of = {
        machine: iter(assign_visible_devices(local_gpu_count if machine == "" else None,
                                             machine_of.count(machine), spec.gpus_per_task))
        for machine in dict.fromkeys(machine_of)
    }

    cluster = cluster_addresses(spec.tasks)
    plans = []
    for task, (task_type, index), local, machine in zip(spec.tasks, task_names(spec.tasks), is_local, machine_of):

        env = {
            "TF_CONFIG": json.dumps(build_tf_config(cluster, task_type, index), separators=(",", ":")),
            ENV_RUN_ID: run_id,
            ENV_TASK_TYPE: task_type,
            ENV_TASK_INDEX: str(index),
            "PYTHONUNBUFFERED": "1",  # line-by-line output through the launcher's pipes
        }
        if spec.threads_per_task:
            threads = str(spec.threads_per_task)
            env.update(OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS=threads)
        devices = next(devices_of[machine])
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        env.update(spec.env)

        if spec.command is None:
            python = spec.python or (launcher_python if local else REMOTE_PYTHON)
            argv = (python, "-m", TRAINER_MODULE, *spec.trainer_args)
        else:
            argv = spec.command
        plans.append(
            TaskPlan(
                type=task_type,
                index=index,
                host=task.host,
                port=task.port,
                local=local,
                ssh=None if local else task.ssh.merged_over(spec.ssh_defaults),
                argv=tuple(argv),
                env=env,
                workdir=spec.workdir,
                waits_for_ready=spec.command is None,
            )
        )
    return plans


def select_task(plans: Sequence[TaskPlan], task_type: str, index: int) -> TaskPlan:
    for plan in plans:
        if plan.type == task_type and plan.index == index:
            return plan
    count = sum(plan.type == task_type for plan in plans)
    if count == 0:
        raise SpecError(f"the cluster has no {task_type} task")
    raise SpecError(f"task index {index} is out of range: the cluster has {count} {task_type} task(s), 0-{count - 1}")


# ---------------------------------------------------------------------------
# Rendering for --dry-run and tf-config.


def plan_to_json(plans: Sequence[TaskPlan]) -> dict:
    return {
        "tasks": [
            {
                "type": plan.type,
                "index": plan.index,
                "host": plan.host,
                "port": plan.port,
                "local": plan.local,
                "argv": list(plan.argv),
                "env": dict(plan.env),
                "tf_config": plan.tf_config,
            }
            for plan in plans
        ]
    }


def describe_start(plan: TaskPlan) -> str:
    """How a task would start: `local`, or `ssh [user@]host[:port]` (gaps come from ~/.ssh/config)."""
    if plan.local:
        return "local"
    ssh = plan.ssh or SshSettings()
    target = (f"{ssh.user}@" if ssh.user else "") + format_address(plan.host, ssh.port)
    via = f" via {ssh.proxy_jump}" if ssh.proxy_jump else ""
    return f"ssh {target}{via}"


def render_plan_text(plans: Sequence[TaskPlan]) -> str:
    lines = [f"Dry run: {len(plans)} task(s); nothing is started.", ""]
    for plan in plans:
        where = format_address(plan.host, plan.port)
        lines.append(f"{plan.name}  {where}  ({describe_start(plan)})")
        lines.append(f"  command:   {shlex.join(plan.argv)}")
        if plan.workdir:
            lines.append(f"  workdir:   {plan.workdir}")
        added = [f"{name}={shlex.quote(value)}" for name, value in plan.env.items() if name != "TF_CONFIG"]
        lines.append("  env:       " + ("\n             ".join(added) if added else "(none)"))
        lines.append("  TF_CONFIG:")
        lines += ["    " + line for line in _pretty_tf_config(plan.tf_config)]
        lines.append("")
    return "\n".join(lines)


def _pretty_tf_config(tf_config: dict) -> list[str]:
    """TF_CONFIG with one line per role, which stays readable for long host lists."""
    roles = [f"    {json.dumps(role)}: {json.dumps(hosts)}" for role, hosts in tf_config["cluster"].items()]
    return ["{", '  "cluster": {', *_joined(roles), "  },", f'  "task": {json.dumps(tf_config["task"])}', "}"]


def _joined(lines: list[str]) -> list[str]:
    return [line + ("," if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


def render_tf_config(plan: TaskPlan, fmt: str) -> str:
    if fmt == "env":
        return f"export TF_CONFIG={shlex.quote(plan.env['TF_CONFIG'])}"
    return json.dumps(plan.tf_config, indent=2)
