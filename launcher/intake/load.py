"""What a command asked for, read in: the one module between the command line and the planner
that reads files and this machine.

The command line converts its options once into requests (HostsRequest, TaskSettings, HostNaming);
from them this module reads the ClusterSpec from its one source (a spec file, a hostfile, the hosts
given, free local ports for --local, the Slurm allocation), applies the settings over it (an env
file, variables of this environment), and makes the plans with what only this machine knows (its
names, its GPUs, the ssh config's HostNames). `mgpu launch`, `check`, `tf-config` and `k8s` share it.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import secrets
import sys
import time

from launcher.config.addresses import is_loopback
from launcher.config.envfile import parse_env_file
from launcher.config.hostfile import parse_hostfile
from launcher.config.slurm_env import read_allocation, without_nodes
from launcher.config.spec import ClusterSpec, SshSettings, build_tasks, expand_slots, local_tasks, slurm_tasks
from launcher.config.spec_file import load_spec_text
from launcher.errors import UsageError

# `--chief` and `--evaluator` given without a value under --local: run that role on this machine too.
THIS_MACHINE = object()


class SlurmScope(enum.Enum):
    ALLOCATION = "allocation"  # every task of the allocation mgpu runs in
    STEP = "step"  # the tasks of the current job step


@dataclasses.dataclass(frozen=True)
class HostsRequest:
    """Where the cluster's hosts come from, as the command line said it: exactly one source
    (the command line checks that when it makes one), and the chief and evaluator around it."""

    workers: tuple | None = None
    slot_hosts: tuple | None = None
    hostfile: str | None = None
    spec_file: str | None = None
    local: int | None = None
    slurm: SlurmScope | None = None
    chief: object = None  # an Endpoint, THIS_MACHINE (given without a value), or None
    evaluator: object = None
    ps_hosts: tuple = ()  # parameter servers' endpoints
    ps: int = 0  # with --local: how many parameter servers
    port: int = 2222
    ssh_defaults: SshSettings = SshSettings()
    spares: tuple[str, ...] = ()  # under Slurm: the allocation's nodes that its tasks leave free


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What launch's options set in every task, over the spec's own settings."""

    env_pairs: tuple[tuple[str, str], ...] = ()
    env_file: str | None = None
    forward_env: tuple[str, ...] = ()  # names, or prefixes ending in "*"
    workdir: str | None = None
    python: str | None = None
    threads_per_task: int | None = None
    gpus_per_task: int | None = None
    legacy_keras: bool = False
    sync: str | None = None
    setup: str | None = None
    setup_timeout: float | None = None


@dataclasses.dataclass(frozen=True)
class HostNaming:
    """How remote hosts are written into TF_CONFIG: as the ssh config's HostName for them, unless
    keep_host_names."""

    ssh_config: str | None = None
    keep_host_names: bool = False


def read_spec(request: HostsRequest) -> ClusterSpec:
    """The ClusterSpec that the request describes (I/O: spec files, hostfiles, free local ports)."""
    if request.slurm is not None:
        return _slurm_spec(request.port, request.slurm is SlurmScope.STEP, request.chief is THIS_MACHINE,
                           request.evaluator is THIS_MACHINE, request.spares)
    if request.spec_file:
        spec = load_spec_text(read_text(request.spec_file, "--spec"), request.spec_file)
        # The command line's SSH settings win over the file's `ssh:`.
        return dataclasses.replace(spec, ssh_defaults=request.ssh_defaults.merged_over(spec.ssh_defaults))
    if request.local is not None:
        from launcher.host.ports import pick_free_ports
        from launcher.supervise.run_lock import claim_port

        with_chief = request.chief is THIS_MACHINE
        ports = pick_free_ports(request.local + with_chief + request.ps, claim=claim_port)
        return ClusterSpec(tasks=local_tasks(ports, with_chief, with_evaluator=request.evaluator is THIS_MACHINE,
                                             ps=request.ps))
    if request.hostfile:
        workers = expand_slots(parse_hostfile(read_text(request.hostfile, "--hostfile"), request.hostfile), request.port)
    elif request.slot_hosts:
        workers = expand_slots(request.slot_hosts, request.port)
    else:
        workers = request.workers
    return ClusterSpec(tasks=build_tasks(request.chief, workers, request.evaluator, request.port, ps=request.ps_hosts),
                       ssh_defaults=request.ssh_defaults)


def _slurm_spec(port: int, step: bool, with_chief: bool, with_evaluator: bool, spares: tuple[str, ...] = ()) -> ClusterSpec:
    """The tasks of the Slurm allocation (or job step) this process runs in, on its nodes but `spares`."""
    allocation = without_nodes(read_allocation(os.environ, step=step), spares)
    tasks = slurm_tasks(allocation.nodes, allocation.tasks_per_node, port, with_chief, with_evaluator)
    return ClusterSpec(tasks=tasks, gpus_per_task=allocation.gpus_per_task, spares=spares)


def read_text(path: str, option: str) -> str:
    """A UTF-8 regular file of at most MAX_INPUT_BYTES (launcher.host.files)."""
    from launcher.host.files import read_input_file

    data = read_input_file(path, option)
    if b"\0" in data:
        raise UsageError(f"{option} {path}: not a text file (it contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path}: not a text file (not UTF-8)") from None


def check_text_value(option: str, text: str, secret: bool = False) -> None:
    """Refuse a NUL character or text that is not UTF-8 (see the command line's check_text); a
    `secret` value is not shown."""
    shown = "its value" if secret else repr(text)
    if "\0" in text:
        raise UsageError(f"{option}: {shown} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = "its value" if secret else repr(text.encode("utf-8", "surrogateescape"))
        raise UsageError(f"{option}: {shown} is not valid UTF-8") from None


def make_plans(spec: ClusterSpec, run_id: str, naming: HostNaming | None = None, count_gpus: bool = True,
               slurm: bool = False, max_restarts: int = 0, sync_max_bytes: int | None = None):
    """Plans for the spec (I/O first: this machine's names, its GPU count, the ssh config, and with
    `sync_max_bytes`, the files of the spec's `sync` folder, at most that many bytes).

    `count_gpus` False skips nvidia-smi where CUDA_VISIBLE_DEVICES is not shown; `slurm` plans every
    task as one task of a Slurm job step (this machine's GPUs do not matter). With `naming`, remote
    host names are written as naming says (not under Slurm: no SSH there).
    """
    from launcher.host.gpus import detect_gpus
    from launcher.host.names import local_host_names
    from launcher.plan.planner import plan_tasks

    synced = None
    if spec.sync and sync_max_bytes is not None:
        from launcher.intake.sync_folder import read_synced_folder

        if slurm:
            raise UsageError("--sync copies the folder to SSH hosts; the nodes of a Slurm allocation share "
                             "their files: give --workdir instead")
        synced = read_synced_folder(spec.sync, sync_max_bytes)
    local_hosts = local_host_names()
    return plan_tasks(
        spec,
        run_id=run_id,
        local_hosts=local_hosts,
        launcher_python=sys.executable,
        local_gpu_count=detect_gpus() if count_gpus and not slurm else 0,
        slurm=slurm,
        max_restarts=max_restarts,
        resolved=ssh_config_addresses(spec, local_hosts, naming) if naming is not None and not slurm else None,
        synced=synced,
    )


def spare_plans(spec: ClusterSpec, run_id: str, naming: HostNaming | None = None) -> list:
    """For `mgpu check`: the tasks each spare host would run in place of the last host of the
    cluster (same program, ports and settings), so that the checks look at the spares too."""
    from launcher.config.spec import with_host_replaced

    if not spec.spares or not spec.tasks:
        return []
    replaced = spec.tasks[-1].host
    plans = []
    for spare in spec.spares:
        changed = with_host_replaced(spec, replaced, spare)
        plans.extend(plan for plan in make_plans(changed, run_id, naming) if plan.host == spare)
    return plans


def ssh_config_addresses(spec: ClusterSpec, local_hosts: frozenset[str], naming: HostNaming) -> dict[str, str]:
    """Remote host name -> the ssh config's HostName for it (I/O: reads the config file)."""
    if naming.keep_host_names:
        return {}
    remote = sorted({t.host for t in spec.tasks if t.host not in local_hosts and not is_loopback(t.host)})
    path = os.path.expanduser(naming.ssh_config or "~/.ssh/config")
    if not remote or not os.path.exists(path):
        return {}  # nothing to look up: do not load paramiko
    from launcher.backends.ssh.target import hostname_addresses

    return hostname_addresses(remote, naming.ssh_config)


def new_run_id() -> str:
    """The time, for sorting, and 128 random bits, so that no one can guess the next run's id."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(16)


def with_command_line(spec: ClusterSpec, command: tuple[str, ...]) -> ClusterSpec:
    """Apply what follows `--`: arguments starting with a dash extend the program the spec runs
    (the built-in trainer, or the spec file's command); anything else replaces the program."""
    if not command:
        return spec
    if not command[0].startswith("-"):
        return dataclasses.replace(spec, command=command)
    if spec.command is not None:
        return dataclasses.replace(spec, command=spec.command + command)
    return dataclasses.replace(spec, trainer_args=spec.trainer_args + command)


def with_task_settings(spec: ClusterSpec, settings: TaskSettings) -> ClusterSpec:
    """The spec with the settings over it (I/O: the env file, and the launcher's environment for
    --forward-env)."""
    given: dict[str, str] = {}
    if settings.env_file:
        given.update(parse_env_file(read_text(settings.env_file, "--env-file"), settings.env_file))
    for pattern in settings.forward_env:
        if pattern.endswith("*"):  # a prefix: whatever of it is set here, maybe nothing
            names = sorted(name for name in os.environ if name.startswith(pattern[:-1]))
        elif pattern in os.environ:
            names = [pattern]
        else:
            raise UsageError(f"--forward-env {pattern}: {pattern} is not set in this environment")
        for name in names:
            check_text_value(f"--forward-env {name}", os.environ[name], secret=True)
            given[name] = os.environ[name]
    given.update(settings.env_pairs)
    env = {**spec.env, **given}
    return dataclasses.replace(
        spec,
        env=env,
        secret_env=spec.secret_env | frozenset(given),
        workdir=settings.workdir or spec.workdir,
        python=settings.python or spec.python,
        threads_per_task=settings.threads_per_task or spec.threads_per_task,
        gpus_per_task=settings.gpus_per_task if settings.gpus_per_task is not None else spec.gpus_per_task,
        legacy_keras=settings.legacy_keras or spec.legacy_keras,
        sync=settings.sync or spec.sync,
        setup=settings.setup or spec.setup,
        setup_timeout=settings.setup_timeout if settings.setup_timeout is not None else spec.setup_timeout,
    )
