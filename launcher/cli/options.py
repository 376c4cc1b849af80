"""Options shared by the commands, and the translation of click's keyword arguments into the
typed objects the rest of mgpu takes: ClusterSpec, LaunchOptions, SshOptions."""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import secrets
import sys
import time

import click

from launcher.cli import params
from launcher.host.files import MAX_KNOWN_HOSTS_BYTES as KNOWN_HOSTS_LIMIT
from launcher.cli.main import debug_flag
from launcher.config.spec import ClusterSpec, SshSettings
from launcher.errors import UsageError
from launcher.launch_options import LaunchOptions
from launcher.runners.ssh.options import SshOptions
from launcher.supervise.options import DEFAULT_STALL_TIMEOUT, SuperviseOptions

# `--chief` and `--evaluator` given without a value under --local: run that role on this machine too.
THIS_MACHINE = object()


def cluster_options(no_value_with: str | None):
    """Options that say which tasks make up the cluster: shared by launch, tf-config and check.

    `no_value_with` names the options of the command under which --chief and --evaluator take no
    value (the task runs where that option puts it); None: they always take a host.
    """
    role_option = {"is_flag": False, "flag_value": THIS_MACHINE} if no_value_with else {}
    no_value = f" With {no_value_with}, no value." if no_value_with else ""
    options = [
        click.option("--workers", type=params.ENDPOINT_LIST, metavar="HOST[:PORT],...",
                     help="Worker hosts, comma-separated: host, host:port, user@host:port or [IPv6]:port; "
                          "Slurm hostlists such as node[01-04]:2222 expand."),
        click.option("--chief", type=params.ENDPOINT, **role_option,
                     metavar="HOST:PORT", help="A chief task (task type 'chief')." + no_value),
        click.option("--evaluator", type=params.ENDPOINT, **role_option,
                     metavar="HOST", help="A sidecar evaluator (not part of the cluster)." + no_value),
        click.option("--port", type=params.PORT, default=2222, show_default=True,
                     help="Port for hosts listed without one."),
        click.option("--hosts", "slot_hosts", type=params.SLOTS_LIST, metavar="HOST:SLOTS,...",
                     help="Workers as Horovod's -H writes them: SLOTS tasks per host, on ports from --port upward."),
        click.option("--hostfile", type=params.InputFile(), metavar="FILE",
                     help="Workers from a file: 'host[:port]' per line, or 'host slots=N [max_slots=M]' "
                          "(N tasks on consecutive ports; a host on several lines adds its slots up)."),
        click.option("--spec", "spec_file", type=params.InputFile(), metavar="FILE",
                     help="A YAML or JSON cluster spec (its schema: docs/hosts.md)."),
    ]

    def decorate(func):
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


ssh_config_option = click.option(
    "--ssh-config", type=params.InputFile(), metavar="FILE",
    help="An OpenSSH config file to use instead of ~/.ssh/config.")
keep_host_names_option = click.option(
    "--keep-host-names", is_flag=True,
    help="Write hosts into TF_CONFIG as given, not as the HostName their ssh config names.")


def host_address_options(func):
    """The part of ssh_options that decides the address TF_CONFIG gives each host (for tf-config)."""
    return ssh_config_option(keep_host_names_option(func))


def ssh_options(func):
    options = [
        click.option("--ssh-user", help="SSH user for hosts that name none."),
        click.option("--ssh-port", type=params.PORT, help="SSH port for hosts that name none."),
        click.option("--identity", type=params.InputFile(), metavar="FILE",
                     help="SSH private key file."),
        ssh_config_option,
        click.option("--known-hosts", type=params.InputFile(KNOWN_HOSTS_LIMIT, must_exist=False), metavar="FILE",
                     help="A known_hosts file to trust besides ~/.ssh/known_hosts."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record keys of hosts not seen before (like StrictHostKeyChecking=accept-new). "
                          "A changed key is always refused."),
        keep_host_names_option,
        click.option("--connect-timeout", type=params.Seconds(0.1), default=10.0, show_default=True,
                     metavar="SECONDS", help="Timeout for each SSH connection."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


class SlurmScope(enum.Enum):
    ALLOCATION = "--slurm"  # every task of the allocation mgpu runs in
    STEP = "--from-slurm"  # the tasks of the current job step


@dataclasses.dataclass(frozen=True)
class HostsRequest:
    """Where the cluster's hosts come from, as the command line said it: exactly one source
    (checked when made, by hosts_request), and the chief and evaluator around it."""

    workers: tuple | None = None
    slot_hosts: tuple | None = None
    hostfile: str | None = None
    spec_file: str | None = None
    local: int | None = None
    slurm: SlurmScope | None = None
    chief: object = None  # an Endpoint, THIS_MACHINE (given without a value), or None
    evaluator: object = None
    port: int = 2222
    ssh_defaults: SshSettings = SshSettings()


def hosts_request(opts: dict, local: int | None = None, slurm: SlurmScope | None = None) -> HostsRequest:
    """The HostsRequest of a command's options; UsageError, in the words of the flags, when the
    sources conflict or --chief/--evaluator take a value where they cannot (or lack one)."""
    sources = [name for name, given in (("--workers", opts.get("workers")), ("--hosts", opts.get("slot_hosts")),
                                        ("--hostfile", opts.get("hostfile")), ("--spec", opts.get("spec_file")),
                                        ("--local", local is not None), (slurm and slurm.value, slurm)) if given]
    if len(sources) > 1:
        raise UsageError(f"give only one of {' and '.join(sources)}")
    if not sources:
        raise UsageError("no hosts: give --workers, --hosts, --hostfile, --spec, --local or --slurm")
    chief, evaluator = opts.get("chief"), opts.get("evaluator")
    flag_mode = "--local" if local is not None else slurm and slurm.value  # where --chief, --evaluator take no value
    for flag, value in (("--chief", chief), ("--evaluator", evaluator)):
        if flag_mode is None and value is THIS_MACHINE:
            raise UsageError(f"{flag} needs a host here (it takes no value only with --local or --slurm)")
        if flag_mode is not None and value not in (None, THIS_MACHINE):
            raise UsageError(f"with {flag_mode}, {flag} takes no value: "
                             + ("every task runs on this machine" if local is not None else "the allocation says where"))
    if opts.get("spec_file") and (chief or evaluator):
        raise UsageError("--chief and --evaluator cannot be combined with --spec: put them in the spec file")
    return HostsRequest(
        workers=opts.get("workers"), slot_hosts=opts.get("slot_hosts"), hostfile=opts.get("hostfile"),
        spec_file=opts.get("spec_file"), local=local, slurm=slurm, chief=chief, evaluator=evaluator,
        port=opts.get("port", 2222),
        ssh_defaults=SshSettings(user=opts.get("ssh_user"), port=opts.get("ssh_port"), identity_file=opts.get("identity")))


def read_spec(request: HostsRequest) -> ClusterSpec:
    """The ClusterSpec that the request describes (I/O: spec files, hostfiles, free local ports)."""
    from launcher.config.hostfile import parse_hostfile
    from launcher.config.spec import build_tasks, expand_slots, local_tasks
    from launcher.config.spec_file import load_spec_text

    if request.slurm is not None:
        return _slurm_spec(request.port, request.slurm is SlurmScope.STEP, request.chief is THIS_MACHINE,
                           request.evaluator is THIS_MACHINE)
    if request.spec_file:
        spec = load_spec_text(read_text(request.spec_file, "--spec"), request.spec_file)
        # The command line's SSH settings win over the file's `ssh:`.
        return dataclasses.replace(spec, ssh_defaults=request.ssh_defaults.merged_over(spec.ssh_defaults))
    if request.local is not None:
        from launcher.host.ports import pick_free_ports

        with_chief = request.chief is THIS_MACHINE
        return ClusterSpec(tasks=local_tasks(pick_free_ports(request.local + with_chief), with_chief,
                                             with_evaluator=request.evaluator is THIS_MACHINE))
    if request.hostfile:
        workers = expand_slots(parse_hostfile(read_text(request.hostfile, "--hostfile"), request.hostfile), request.port)
    elif request.slot_hosts:
        workers = expand_slots(request.slot_hosts, request.port)
    else:
        workers = request.workers
    return ClusterSpec(tasks=build_tasks(request.chief, workers, request.evaluator, request.port),
                       ssh_defaults=request.ssh_defaults)


def _slurm_spec(port: int, step: bool, with_chief: bool, with_evaluator: bool) -> ClusterSpec:
    """The tasks of the Slurm allocation (or job step) this process runs in."""
    from launcher.config.slurm_env import read_allocation
    from launcher.config.spec import slurm_tasks

    allocation = read_allocation(os.environ, step=step)
    tasks = slurm_tasks(allocation.nodes, allocation.tasks_per_node, port, with_chief, with_evaluator)
    return ClusterSpec(tasks=tasks, gpus_per_task=allocation.gpus_per_task)


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


def check_text(opts: dict, command: tuple[str, ...] = ()) -> None:
    """Refuse arguments with NUL characters or bytes that are not UTF-8: the environment and the
    console cannot carry them, and remote hosts would get something else than what was written.
    Each is named by its flag, as the running command declares it."""
    context = click.get_current_context(silent=True)
    flags = {param.name: param.opts[0] for param in (context.command.params if context else ())}
    values = [(flags.get(key, key), value) for key, value in opts.items()]
    values += [("the command", arg) for arg in command]
    for option, value in values:
        for text in _strings(value):
            _check_one_text(option, text)


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list, frozenset)):
        return [text for item in value for text in _strings(item)]
    return []


def _check_one_text(option: str, text: str) -> None:
    if "\0" in text:
        raise UsageError(f"{option}: {text!r} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{option}: {text.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8") from None


@dataclasses.dataclass(frozen=True)
class HostNaming:
    """How remote hosts are written into TF_CONFIG: as the ssh config's HostName for them, unless
    keep_host_names."""

    ssh_config: str | None = None
    keep_host_names: bool = False


def host_naming(opts: dict) -> HostNaming:
    return HostNaming(opts.get("ssh_config") or None, bool(opts.get("keep_host_names")))


def make_plans(spec: ClusterSpec, run_id: str, naming: HostNaming | None = None, count_gpus: bool = True,
               slurm: bool = False):
    """Plans for the spec (I/O first: this machine's names, its GPU count, the ssh config).

    `count_gpus` False skips nvidia-smi where CUDA_VISIBLE_DEVICES is not shown; `slurm` plans every
    task as one task of a Slurm job step (this machine's GPUs do not matter). With `naming`, remote
    host names are written as naming says (not under Slurm: no SSH there).
    """
    from launcher.host.gpus import detect_gpus
    from launcher.host.names import local_host_names
    from launcher.plan.planner import plan_tasks

    local_hosts = local_host_names()
    return plan_tasks(
        spec,
        run_id=run_id,
        local_hosts=local_hosts,
        launcher_python=sys.executable,
        local_gpu_count=detect_gpus() if count_gpus and not slurm else 0,
        slurm=slurm,
        resolved=ssh_config_addresses(spec, local_hosts, naming) if naming is not None and not slurm else None,
    )


def ssh_config_addresses(spec: ClusterSpec, local_hosts: frozenset[str], naming: HostNaming) -> dict[str, str]:
    """Remote host name -> the ssh config's HostName for it (I/O: reads the config file)."""
    from launcher.config.addresses import is_loopback

    if naming.keep_host_names:
        return {}
    remote = sorted({t.host for t in spec.tasks if t.host not in local_hosts and not is_loopback(t.host)})
    path = os.path.expanduser(naming.ssh_config or "~/.ssh/config")
    if not remote or not os.path.exists(path):
        return {}  # nothing to look up: do not load paramiko
    from launcher.runners.ssh.target import hostname_addresses

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


def task_settings(opts: dict) -> TaskSettings:
    return TaskSettings(tuple(opts.get("env_pairs", ())), opts.get("env_file"), tuple(opts.get("forward_env", ())),
                        opts.get("workdir"), opts.get("python"), opts.get("threads_per_task"),
                        opts.get("gpus_per_task"), bool(opts.get("legacy_keras")))


def with_task_settings(spec: ClusterSpec, settings: TaskSettings) -> ClusterSpec:
    """The spec with the settings over it (I/O: the env file, and the launcher's environment for
    --forward-env)."""
    from launcher.config.envfile import parse_env_file

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
            _check_one_text(f"--forward-env {name}", os.environ[name])
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
    )


def ssh_options_from(opts: dict) -> SshOptions:
    """SshOptions from the parsed options; those a command does not have keep their defaults."""
    defaults = SshOptions()
    return SshOptions(
        known_hosts=opts.get("known_hosts") or None,
        accept_new_host_keys=bool(opts.get("accept_new_host_keys")),
        ssh_config=opts.get("ssh_config") or None,
        connect_timeout=float(opts.get("connect_timeout") or defaults.connect_timeout),
        debug=debug_flag(click.get_current_context(silent=True)),
    )


def launch_options_from(opts: dict, run_id: str, spec: ClusterSpec) -> LaunchOptions:
    stall_timeout = next((value for value in (opts.get("stall_timeout"), spec.stall_timeout) if value is not None),
                         DEFAULT_STALL_TIMEOUT)
    return LaunchOptions(
        supervise=SuperviseOptions(
            run_id=run_id,
            log_dir=pathlib.Path(opts["log_dir"]),
            grace_period=opts["grace_period"],
            start_timeout=opts["start_timeout"],
            stall_timeout=stall_timeout,
            max_restarts=opts["max_restarts"],
            timestamps=opts["timestamps"],
            show=opts["show"],
            show_tf_logs=opts["show_tf_logs"],
            show_secrets=opts["show_secrets"],
        ),
        ssh=ssh_options_from(opts),
        check_hosts=not opts["no_check"],
        allow_public=opts["allow_public"],
    )
