"""The cluster spec: which tasks run where, and how to reach their hosts."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence


from launcher.errors import SpecError
from launcher.exit_codes import ExitRule
from launcher.protocol import TASK_TYPES
from launcher.config.addresses import Endpoint, format_address
from launcher.config.hostlist import check_task_total

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
ROLES = TASK_TYPES  # also the order tasks are planned and shown in


@dataclasses.dataclass(frozen=True)
class SshSettings:
    """How to log into one host. None means: ask ~/.ssh/config, then the defaults."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None

    def merged_over(self, defaults: "SshSettings") -> "SshSettings":
        """These settings, with gaps filled from `defaults`."""
        return SshSettings(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
                for f in dataclasses.fields(self)
            }
        )


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: its role and where it runs. An evaluator has no port (it is not in the cluster)."""

    role: str
    host: str
    port: int | None
    ssh: SshSettings = SshSettings()


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    tasks: tuple[TaskSpec, ...]
    # The program each task runs; None means the built-in trainer.
    command: tuple[str, ...] | None = None
    # Arguments for the built-in trainer (only when command is None).
    trainer_args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    # SSH settings for hosts whose own settings leave a gap.
    ssh_defaults: SshSettings = SshSettings()
    # The interpreter that runs the built-in trainer; None means the launcher's own (local tasks)
    # or "python3" (remote tasks).
    python: str | None = None
    threads_per_task: int | None = None
    gpus_per_task: int | None = None
    # The address other tasks reach a host at, where the user gave one (spec file `hosts.H.address`);
    # it wins over the ssh config's HostName.
    addresses: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Run Keras programs with tf_keras (Keras 2): TF_USE_LEGACY_KERAS=1 in every task.
    legacy_keras: bool = False
    # Names in `env` whose values came from --env, --env-file or --forward-env: often credentials,
    # so dry-run and run.json hide them.
    secret_env: frozenset[str] = frozenset()
    # The spec file's stall_timeout (seconds; 0: no stall watchdog); None: the launcher's default.
    stall_timeout: float | None = None
    tensorboard: str | None = None  # the spec file's folder for TensorBoard's event files (--tensorboard)
    # A folder of this machine copied to every remote host before the tasks start (`--sync`);
    # the tasks run in the copy (in the folder itself on this machine).
    sync: str | None = None
    # A shell command run once on every host, in the workdir, before the tasks (`--setup`).
    setup: str | None = None
    setup_timeout: float | None = None
    # Hosts that take the tasks of a host left out during a run (`--spare-hosts`, spec `spares:`), in order.
    spares: tuple[str, ...] = ()
    # A command every host runs before it runs tasks (`--health-check`): non-zero leaves the host out.
    health_check: str | None = None
    # Seconds the health check may take on a host (`--health-check-timeout`); None: preflight/health.py's default.
    health_check_timeout: float | None = None
    # Seconds a host left out for a fault of its own stays quarantined (`--quarantine`); None: its default.
    quarantine: float | None = None
    # The spec file's `exit_codes:` rules (launcher/exit_codes.py), which --exit-codes overrides code by code.
    exit_codes: tuple[ExitRule, ...] = ()
    # The fewest hosts the run goes on with once a host is left out with no spare for it
    # (`--min-hosts`, spec `min_hosts:`); None: a host left out without a spare stops the run.
    min_hosts: int | None = None
    # The job's size as the run was first planned (its members, and their hosts), kept when hosts are
    # left out without a spare (`without_hosts`); None: the tasks' own.
    planned_members: int | None = None
    planned_hosts: int | None = None


MAX_SECONDS = 30 * 24 * 3600.0  # a month: longer waits are mistakes, and inf or nan would hang or crash
# Upper bounds on counts: far above any real machine, low enough that no plan explodes.
MAX_GPUS_PER_TASK = 1024
MAX_THREADS_PER_TASK = 4096
MAX_LOCAL_TASKS = 4096
MAX_MIN_HOSTS = 100_000


# ---------------------------------------------------------------------------
# Building task lists from what the user wrote, and checking them.

PS_NEEDS_CHIEF = ("parameter servers need a chief: ParameterServerStrategy's coordinator runs as the chief "
                  "(give --chief, or a 'chief' in the spec's cluster)")


def build_tasks(
    chief: Endpoint | None,
    workers: Sequence[Endpoint],
    evaluator: Endpoint | None,
    default_port: int | None,
    host_ssh: Mapping[str, SshSettings] | None = None,
    ps: Sequence[Endpoint] = (),
) -> tuple[TaskSpec, ...]:
    """Tasks in planning order (chief, workers, parameter servers, evaluator), checked for consistency.

    A `user@` in an entry and `host_ssh[host]` set that host's SSH settings.
    """
    host_ssh = host_ssh or {}

    def task(role: str, endpoint: Endpoint) -> TaskSpec:
        ssh = host_ssh.get(endpoint.host, SshSettings())
        if endpoint.user:
            ssh = dataclasses.replace(ssh, user=endpoint.user)
        if role == EVALUATOR:
            if endpoint.port is not None:
                raise SpecError(
                    f"evaluator {endpoint}: the evaluator is not part of the cluster and takes no port"
                )
            return TaskSpec(role, endpoint.host, None, ssh)
        port = endpoint.port if endpoint.port is not None else default_port
        if port is None:
            raise SpecError(f"{role} {endpoint} has no port: write {endpoint}:PORT or give --port")
        return TaskSpec(role, endpoint.host, port, ssh)

    tasks = [task(CHIEF, chief)] if chief else []
    tasks += [task(WORKER, endpoint) for endpoint in workers]
    if not tasks:
        raise SpecError("the cluster is empty: give at least one worker")
    if ps and not chief:
        raise SpecError(PS_NEEDS_CHIEF)
    tasks += [task(PS, endpoint) for endpoint in ps]
    if evaluator:
        tasks.append(task(EVALUATOR, evaluator))
    _reject_duplicates(tasks)
    return tuple(tasks)


def _reject_duplicates(tasks: Sequence[TaskSpec]) -> None:
    seen: dict[tuple[str, int], str] = {}
    counts = {role: 0 for role in ROLES}
    for task in tasks:
        name = f"{task.role}:{counts[task.role]}"
        counts[task.role] += 1
        if task.port is None:
            continue
        key = (task.host, task.port)
        if key in seen:
            raise SpecError(f"{format_address(*key)} is listed twice ({seen[key]} and {name})")
        seen[key] = name


def _check_total(total: int) -> None:
    try:
        check_task_total(total)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def local_tasks(ports: Sequence[int], with_chief: bool, with_evaluator: bool, ps: int = 0) -> tuple[TaskSpec, ...]:
    """A cluster simulated on this machine: a chief (if asked), workers and `ps` parameter servers
    (the last ports) on `ports`, on 127.0.0.1."""
    endpoints = [Endpoint("127.0.0.1", port) for port in ports]
    split = len(endpoints) - ps
    return build_tasks(endpoints[0] if with_chief else None, endpoints[with_chief:split],
                       Endpoint("127.0.0.1") if with_evaluator else None, None, ps=endpoints[split:])


def expand_slots(entries: Iterable[tuple[Endpoint, int]], default_port: int | None) -> tuple[Endpoint, ...]:
    """One endpoint per slot: `host slots=3` on port P becomes ports P, P+1, P+2."""
    entries = list(entries)
    _check_total(sum(slots for _, slots in entries))
    endpoints = []
    for endpoint, slots in entries:
        port = endpoint.port if endpoint.port is not None else default_port
        if port is None:
            raise SpecError(f"{endpoint} has no port: write {endpoint}:PORT or give --port")
        if port + slots - 1 > 65535:
            raise SpecError(f"{endpoint} with slots={slots} runs past port 65535")
        endpoints += [dataclasses.replace(endpoint, port=port + i) for i in range(slots)]
    return tuple(endpoints)


def slurm_tasks(nodes: Sequence[str], tasks_per_node: Sequence[int], port: int, with_chief: bool,
                with_evaluator: bool) -> tuple[TaskSpec, ...]:
    """One task per Slurm task, in rank order, on ports from `port` upward on each node.

    With a chief, rank 0 is the chief; with an evaluator, the last rank is the evaluator.
    """
    _check_total(sum(tasks_per_node))
    if port + max(tasks_per_node, default=1) - 1 > 65535:
        raise SpecError(f"{max(tasks_per_node)} tasks per node from port {port} run past port 65535")
    endpoints = [Endpoint(node, port + i) for node, count in zip(nodes, tasks_per_node) for i in range(count)]
    if len(endpoints) < 1 + with_evaluator:
        raise SpecError(f"the allocation has {len(endpoints)} task(s): too few for the evaluator and one "
                        f"training task (ask Slurm for more with -n or --ntasks-per-node)")
    evaluator = Endpoint(endpoints.pop().host) if with_evaluator else None
    chief = endpoints.pop(0) if with_chief else None
    return build_tasks(chief, endpoints, evaluator, None)


def with_spares(spec: ClusterSpec, spares: tuple[str, ...]) -> ClusterSpec:
    """The spec with these spare hosts; UsageError for a spare that runs a task already."""
    used = sorted({task.host for task in spec.tasks} & set(spares))
    if used:
        from launcher.errors import UsageError

        raise UsageError(f"spare host {used[0]} already runs a task; a spare must be a host the run does not use")
    return dataclasses.replace(spec, spares=tuple(dict.fromkeys(spares)))


def with_host_replaced(spec: ClusterSpec, host: str, spare: str) -> ClusterSpec:
    """The spec with the tasks of `host` on `spare` (same roles, ports and SSH settings, so the same
    types and indices), and `spare` no longer a spare."""
    return dataclasses.replace(
        spec,
        tasks=tuple(dataclasses.replace(task, host=spare) if task.host == host else task for task in spec.tasks),
        spares=tuple(h for h in spec.spares if h != spare),
    )


def without_hosts(spec: ClusterSpec, hosts: Sequence[str]) -> ClusterSpec:
    """The spec with no task on `hosts`, the size it was first planned at kept: the run on fewer hosts.

    The tasks left keep their order, so the planner numbers each role 0..n-1 again. A cluster that
    had a chief keeps one: if the chief's host is among `hosts`, the first worker left takes its
    role (and so becomes the job's coordinator, process 0)."""
    gone = set(hosts)
    members = [task for task in spec.tasks if task.role in (CHIEF, WORKER)]
    kept = [task for task in spec.tasks if task.host not in gone]
    if any(task.role == CHIEF for task in members) and not any(task.role == CHIEF for task in kept):
        first = next((i for i, task in enumerate(kept) if task.role == WORKER), None)
        if first is not None:
            kept.insert(0, dataclasses.replace(kept.pop(first), role=CHIEF))
    return dataclasses.replace(
        spec, tasks=tuple(kept),
        planned_members=spec.planned_members or len(members),
        planned_hosts=spec.planned_hosts or len({task.host for task in members}))


def with_tasks_back(spec: ClusterSpec, tasks: Sequence[TaskSpec]) -> ClusterSpec:
    """The spec with `tasks` (those of hosts left out before, taken back) after its own: the tasks
    already running keep their indices, those back are numbered after them. A chief back while
    another task holds the chief's role (without_hosts) comes back as a worker."""
    has_chief = any(task.role == CHIEF for task in spec.tasks)
    back = tuple(dataclasses.replace(task, role=WORKER) if task.role == CHIEF and has_chief else task for task in tasks)
    return dataclasses.replace(spec, tasks=spec.tasks + back)
