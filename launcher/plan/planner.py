"""Planning: a cluster spec becomes one TaskPlan per task. Pure functions, no I/O.

Dry-run renders the plan (render.py); launch executes the same plan.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Iterator, Mapping, Sequence

from launcher.errors import SpecError, UsageError
from launcher.config.addresses import format_address, is_loopback
from launcher.protocol import (ENV_HOSTS_MAX, ENV_RUN_ID, ENV_SYNC_DIGEST, ENV_TASK_INDEX, ENV_TASK_TYPE,
                               ENV_TORCH_LOCAL_WORLD_SIZE, ENV_WORLD_SIZE_MAX, JOB_ENV)
from launcher.config.k8s_env import PodJob
from launcher.config.spec import EVALUATOR, PS, ClusterSpec, SshSettings, TaskSpec
from launcher.config.sync import DEFAULT_SETUP_TIMEOUT, SyncedFolder, default_workdir
from launcher.plan.coordinator import JOB_ROLES, Coordinator, find_coordinator
from launcher.plan.devices import (
    EVERY_GPU, SHARED_GPU_ENV, every_gpu, gpu_rule, shares_a_gpu, shares_every_gpu, split_devices, task_gpu_rule,
)
from launcher.plan.job_env import Job, collectives_env


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
    env: "TaskEnv"  # what the launcher adds to the base environment, TF_CONFIG included
    workdir: str | None
    waits_for_ready: bool  # True when the program speaks the readiness protocol
    # Where the other tasks reach this one: the host part of its TF_CONFIG address. It is `host`
    # unless the ssh config gives an alias a HostName or the spec an `address:` (None: `host`).
    address: str | None = None
    slurm_rank: int | None = None  # the task's SLURM_PROCID when it runs in a Slurm job step
    secret_env: frozenset[str] = frozenset()  # env names whose values dry-run and run.json hide
    # The job's first member (coordinator.py), the same in every task's plan; None: no members.
    coordinator: Coordinator | None = None
    # Which rule gave the task its GPUs, and why (plan/devices.py): what the dry run says.
    gpus: str = ""
    # The folder copied to the task's host before the run (its workdir there), shared by every plan.
    sync: SyncedFolder | None = None
    # What runs once on the task's host, in its workdir, before any task (shared by every plan).
    setup: "HostSetup | None" = None

    def __post_init__(self) -> None:
        # One shape for every plan, a hand-made one too (frozen: set through object.__setattr__).
        if self.address is None:
            object.__setattr__(self, "address", self.host)
        if not isinstance(self.env, TaskEnv):
            object.__setattr__(self, "env", TaskEnv.of(self.env))

    @property
    def reached_elsewhere(self) -> bool:
        """Whether the other tasks dial another name than `host` (shown in dry runs)."""
        return self.address != self.host

    @property
    def name(self) -> str:
        return f"{self.type}:{self.index}"

    @property
    def tf_config(self) -> dict:
        return self.env.tf_config

    @property
    def coordinator_port(self) -> int | None:
        """The port the job's processes other than 0 connect to (JAX's and PyTorch's)."""
        return self.coordinator.port if self.coordinator else None


@dataclasses.dataclass(frozen=True)
class HostSetup:
    """`--setup`: a /bin/sh command run once on every host of the run before its tasks start, with
    the run's own variables (--env, --env-file, the spec's env), not the job's."""

    command: str
    env: Mapping[str, str]
    timeout: float


def tf_config_text(cluster_json: str, task: Mapping) -> str:
    """TF_CONFIG as every task gets it: compact JSON, the cluster (`cluster_json`, compact too) first."""
    return '{"cluster":' + cluster_json + ',"task":' + json.dumps(task, separators=(",", ":")) + "}"


class TaskEnv(Mapping[str, str]):
    """A task's env, TF_CONFIG first. TF_CONFIG is made when read, from the cluster's JSON that
    every task of the plan shares: planning N tasks takes O(N) memory and time, not O(N^2)."""

    def __init__(self, cluster: dict[str, list[str]], cluster_json: str, task: dict, rest: Mapping[str, str],
                 tf_config_text: str | None = None, has_tf_config: bool = True):
        self.cluster = cluster  # shared by every task: never modified
        self.cluster_json = cluster_json
        self.task = task
        self._rest = rest
        self._text = tf_config_text  # a hand-made plan's TF_CONFIG, kept as written
        self._has_tf_config = has_tf_config

    @classmethod
    def of(cls, env: Mapping[str, str]) -> "TaskEnv":
        """The env of a plan made by hand (a test, a tool): TF_CONFIG, if any, exactly as given."""
        rest = {name: value for name, value in env.items() if name != "TF_CONFIG"}
        text = env.get("TF_CONFIG")
        try:
            parsed = json.loads(text) if text is not None else {}
        except ValueError:
            parsed = {}
        parsed = parsed if isinstance(parsed, dict) else {}
        cluster = parsed.get("cluster") if isinstance(parsed.get("cluster"), dict) else {}
        task = parsed.get("task") if isinstance(parsed.get("task"), dict) else {}
        return cls(cluster, json.dumps(cluster, separators=(",", ":")), task, rest, text, text is not None)

    def __getitem__(self, name: str) -> str:
        if name == "TF_CONFIG" and self._has_tf_config:
            if self._text is not None:
                return self._text
            return tf_config_text(self.cluster_json, self.task)
        return self._rest[name]

    def __iter__(self) -> Iterator[str]:
        if self._has_tf_config:
            yield "TF_CONFIG"
        yield from self._rest

    def __len__(self) -> int:
        return int(self._has_tf_config) + len(self._rest)

    def __repr__(self) -> str:
        return f"TaskEnv(task={self.task!r}, {len(self.cluster_json)} bytes of cluster, {self._rest!r})"

    @property
    def tf_config(self) -> dict:
        return {"cluster": {role: list(hosts) for role, hosts in self.cluster.items()}, "task": dict(self.task)}

    def adding(self, extra: Mapping[str, str]) -> "TaskEnv":
        """This env with `extra` added (the cluster is still shared)."""
        return TaskEnv(self.cluster, self.cluster_json, self.task, {**self._rest, **extra}, self._text,
                       self._has_tf_config)


TRAINER_MODULE = "launcher.trainer"
REMOTE_PYTHON = "python3"
# TensorFlow's switch that makes `tf.keras` mean tf_keras (Keras 2) instead of Keras 3.
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def build_tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> dict:
    """TF_CONFIG for one task. The evaluator is not in `cluster` but still has a task entry."""
    return {"cluster": {role: list(addresses) for role, addresses in cluster.items()},
            "task": {"type": task_type, "index": task_index}}


def cluster_addresses(tasks: Sequence[TaskSpec], addresses: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The TF cluster: chief and worker addresses, in order. The evaluator is not a member.

    `addresses` maps a host name to the address the other tasks reach it at.
    """
    addresses = addresses or {}
    cluster: dict[str, list[str]] = {}
    for task in tasks:
        if task.role != EVALUATOR:
            cluster.setdefault(task.role, []).append(format_address(addresses.get(task.host, task.host), task.port))
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
    resolved: Mapping[str, str] | None = None,
    slurm: bool = False,
    max_restarts: int = 0,
    synced: SyncedFolder | None = None,
) -> list[TaskPlan]:
    """One TaskPlan per task, in order: chief, workers, evaluator.

    `local_hosts` are the host names that mean this machine; their tasks run as local processes.
    `local_gpu_count` is the number of GPUs on this machine. With `slurm`, every task is one
    task of a Slurm job step, ranked in plan order, and runs the launcher's Python (the nodes of
    an allocation share its installation). `resolved` maps remote host names to the addresses
    they really are (the ssh config's HostName); the spec's own `addresses` win over it.
    TF_CONFIG lists those addresses, so that the tasks can dial each other. `max_restarts` is
    the run's restart budget, which torchrun's contract tells each task. With `synced` (the
    spec's `sync` folder, as read), local tasks run in that folder and remote ones in its copy:
    the spec's workdir, or a folder named after it under the login directory.
    """
    _check_env(spec.env)
    addresses = {**(resolved or {}), **spec.addresses}
    addresses = {host: address for host, address in addresses.items() if address != host}
    is_local = [False] * len(spec.tasks) if slurm else _locality(spec.tasks, local_hosts, addresses)
    # Tasks on one machine split its GPUs; every local task shares this machine's.
    machine_of = ["" if local else task.host for task, local in zip(spec.tasks, is_local)]
    devices = split_devices(machine_of, local_gpu_count, spec.gpus_per_task)
    rule, why = gpu_rule(spec.command is None, spec.legacy_keras, spec.gpus_per_task)
    if rule == EVERY_GPU:
        shared_gpu = shares_every_gpu(machine_of, devices)
        devices = every_gpu(devices)
    else:
        shared_gpu = shares_a_gpu(machine_of, devices)
    gpus = f"{rule}: {why}"
    cluster = cluster_addresses(spec.tasks, addresses)
    cluster_json = json.dumps(cluster, separators=(",", ":"))
    names = task_names(spec.tasks)
    coordinator = find_coordinator(spec.tasks, addresses)
    threads = _thread_env(spec.threads_per_task, parameter_servers=any(t.role == PS for t in spec.tasks))
    job = Job(cluster, coordinator, dict(zip(names, machine_of)), run_id, max_restarts)
    planned = planned_size(spec)
    merged_ssh = functools.lru_cache(maxsize=None)(lambda ssh: ssh.merged_over(spec.ssh_defaults))
    remote_workdir = (spec.workdir or default_workdir(synced.source)) if synced else spec.workdir
    setup = None
    if spec.setup:
        setup_env = {ENV_RUN_ID: run_id, **({ENV_SYNC_DIGEST: synced.digest} if synced else {}), **spec.env}
        setup = HostSetup(spec.setup, setup_env,
                          spec.setup_timeout if spec.setup_timeout is not None else DEFAULT_SETUP_TIMEOUT)
    plans = []
    for rank, (task, (task_type, index), local, visible, shared) in enumerate(
            zip(spec.tasks, names, is_local, devices, shared_gpu)):
        job_env = job.env(task_type, index)
        env = {
            ENV_RUN_ID: run_id,
            ENV_TASK_TYPE: task_type,
            ENV_TASK_INDEX: str(index),
            **planned,
            **job_env,
            "PYTHONUNBUFFERED": "1",  # line-by-line output through the launcher's pipes
            # Python prints every thread's stack on SIGABRT: how the stall watchdog sees where tasks are.
            "PYTHONFAULTHANDLER": "1",
            **threads,
        }
        if job_env.get(ENV_TORCH_LOCAL_WORLD_SIZE, "1") != "1" and "OMP_NUM_THREADS" not in env:
            # As torchrun: several processes on a host, each with every core's worth of OpenMP threads,
            # would oversubscribe it. The user's --env or --threads-per-task wins.
            env["OMP_NUM_THREADS"] = "1"
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        if shared:  # the user's values win (below)
            env.update(SHARED_GPU_ENV)
        if job_env:  # a member of the job: its JAX collectives must work on its hardware
            env.update(collectives_env(visible))
        if spec.legacy_keras:
            env[LEGACY_KERAS_ENV] = "1"
        if synced:
            env[ENV_SYNC_DIGEST] = synced.digest
        env.update(spec.env)  # the user's values win, JAX_CPU_COLLECTIVES_IMPLEMENTATION included
        plans.append(
            TaskPlan(
                type=task_type,
                index=index,
                host=task.host,
                port=task.port,
                local=local,
                ssh=None if local or slurm else merged_ssh(task.ssh),
                argv=_argv(spec, launcher_python if local or slurm else REMOTE_PYTHON),
                env=TaskEnv(cluster, cluster_json, build_tf_config({}, task_type, index)["task"], env),
                workdir=(synced.source if local else remote_workdir) if synced else spec.workdir,
                waits_for_ready=spec.command is None,
                address=addresses.get(task.host, task.host),
                slurm_rank=rank if slurm else None,
                secret_env=frozenset(spec.secret_env) & frozenset(env),
                coordinator=coordinator,
                gpus=task_gpu_rule(gpus, visible, spec.gpus_per_task),
                sync=synced,
                setup=setup,
            )
        )
    return plans


def planned_size(spec: ClusterSpec) -> dict[str, str]:
    """The job's size as the run was planned (protocol.ENV_WORLD_SIZE_MAX): what every task is told,
    also after hosts were left out without a spare."""
    members = [task for task in spec.tasks if task.role in JOB_ROLES]
    size = spec.planned_members or len(members)
    hosts = spec.planned_hosts or len({task.host for task in members})
    return {ENV_WORLD_SIZE_MAX: str(size), ENV_HOSTS_MAX: str(hosts)}


def _check_env(env: Mapping[str, str]) -> None:
    for name in env:
        if name == "TF_CONFIG" or name in JOB_ENV or name.startswith("MGPU_"):
            raise SpecError(f"environment variable {name} is set by mgpu for each task and cannot be given")


def _locality(tasks: Sequence[TaskSpec], local_hosts: frozenset[str], addresses: Mapping[str, str]) -> list[bool]:
    """Whether each task runs on this machine. Loopback addresses (after `addresses`) mixed with
    remote hosts are refused."""
    loopback_hosts = {host for host in {task.host for task in tasks} if is_loopback(host)}
    is_local = [task.host in local_hosts or task.host in loopback_hosts for task in tasks]
    _reject_shared_sockets(tasks, is_local)
    reached = [addresses.get(task.host, task.host) for task in tasks]
    loopback_addresses = {address for address in set(reached) if is_loopback(address)}
    loopback = [address for address in reached if address in loopback_addresses]
    remote = [address for address, local in zip(reached, is_local) if not local and address not in loopback_addresses]
    if loopback and remote:
        raise SpecError(
            f"loopback address {loopback[0]} is mixed with remote host {remote[0]}: remote tasks would "
            f"dial their own loopback and hang; use an address the other hosts can reach"
        )
    return is_local


def _reject_shared_sockets(tasks: Sequence[TaskSpec], is_local: Sequence[bool]) -> None:
    """Refuse two names of this machine with one port (localhost:P and 127.0.0.1:P): TensorFlow's
    server listens on every interface, so both tasks would bind one socket."""
    seen: dict[int, tuple[str, str]] = {}
    for task, (task_type, index), local in zip(tasks, task_names(tasks), is_local):
        if not local or task.port is None:
            continue
        address, name = format_address(task.host, task.port), f"{task_type}:{index}"
        if task.port in seen:
            first_address, first_name = seen[task.port]
            raise SpecError(f"{first_address} ({first_name}) and {address} ({name}) are one socket on this "
                            f"machine: give each task its own port")
        seen[task.port] = (address, name)


def _thread_env(threads_per_task: int | None, parameter_servers: bool = False) -> dict[str, str]:
    if not threads_per_task:
        return {}
    threads = str(threads_per_task)
    # Under ParameterServerStrategy a worker's function waits on the ps tasks' variables inside an
    # inter-op thread: with only one, the chief waits for ever on its workers.
    inter_op = str(max(2, threads_per_task)) if parameter_servers else threads
    return {"OMP_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads, "TF_NUM_INTEROP_THREADS": inter_op}


def _argv(spec: ClusterSpec, default_python: str) -> tuple[str, ...]:
    """The spec's command, or the built-in trainer run by the spec's Python (or the default one)."""
    if spec.command is not None:
        return tuple(spec.command)
    return (spec.python or default_python, "-m", TRAINER_MODULE, *spec.trainer_args)


def in_step_order(plans: Sequence[TaskPlan], nodes: Sequence[str]) -> list[TaskPlan]:
    """The plans of a Slurm step ranked in the order of their hosts in `nodes` (the allocation's),
    each node's tasks in their order: srun's block layout gives the first node the first ranks. A
    spare node that took a node's tasks may come before other nodes; the tasks keep their types
    and indices, only their ranks follow the layout."""
    position = {node: i for i, node in enumerate(nodes)}
    ordered = sorted(plans, key=lambda plan: position.get(plan.host, len(nodes)))
    return [dataclasses.replace(plan, slurm_rank=rank) for rank, plan in enumerate(ordered)]


def select_task(plans: Sequence[TaskPlan], task_type: str, index: int) -> TaskPlan:
    for plan in plans:
        if plan.type == task_type and plan.index == index:
            return plan
    count = sum(plan.type == task_type for plan in plans)
    if count == 0:
        raise SpecError(f"the cluster has no {task_type} task")
    raise SpecError(f"task index {index} is out of range: the cluster has {count} {task_type} task(s), 0-{count - 1}")


def pod_plan(pod: PodJob, argv: Sequence[str], launcher_python: str) -> TaskPlan:
    """A Kubernetes pod's task, planned from the whole job. The scheduler places the tasks, as in a
    Slurm step: no task is this machine's, and the GPUs Kubernetes gave the pod stay as they are."""
    if not argv:
        raise UsageError("no program to run: give it after `--`")
    plans = plan_tasks(pod.cluster_spec(tuple(argv)), run_id=pod.job, local_hosts=frozenset(),
                       launcher_python=launcher_python, slurm=True)
    return plans[pod.index]
