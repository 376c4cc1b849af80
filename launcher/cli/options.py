"""Options shared by the commands, and the translation of click's keyword arguments into the
typed objects the rest of mgpu takes: ClusterSpec, LaunchOptions, SshOptions."""

from __future__ import annotations

import dataclasses
import math
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
from launcher.launch import LaunchOptions
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


def read_spec(opts: dict, local: int | None = None, slurm: str | None = None) -> ClusterSpec:
    """The ClusterSpec that the options describe. Exactly one source of hosts must be given.

    `slurm` is "--slurm" (the tasks of the allocation) or "--from-slurm" (of the current step).
    """
    from launcher.config.hostfile import parse_hostfile
    from launcher.config.spec import build_tasks, expand_slots, local_tasks
    from launcher.config.spec_file import load_spec_text

    sources = [name for name, given in (("--workers", opts.get("workers")), ("--hosts", opts.get("slot_hosts")),
                                        ("--hostfile", opts.get("hostfile")), ("--spec", opts.get("spec_file")),
                                        ("--local", local is not None), (slurm, slurm)) if given]
    if len(sources) > 1:
        raise UsageError(f"give only one of {' and '.join(sources)}")
    if not sources:
        raise UsageError("no hosts: give --workers, --hosts, --hostfile, --spec, --local or --slurm")
    chief, evaluator = opts.get("chief"), opts.get("evaluator")
    flag_mode = "--local" if local is not None else slurm  # where --chief and --evaluator take no value
    for flag, value in (("--chief", chief), ("--evaluator", evaluator)):
        if flag_mode is None and value is THIS_MACHINE:
            raise UsageError(f"{flag} needs a host here (it takes no value only with --local or --slurm)")
        if flag_mode is not None and value not in (None, THIS_MACHINE):
            raise UsageError(f"with {flag_mode}, {flag} takes no value: "
                             + ("every task runs on this machine" if local is not None else "the allocation says where"))
    if slurm:
        return _slurm_spec(opts, slurm == "--from-slurm", chief is THIS_MACHINE, evaluator is THIS_MACHINE)
    ssh_defaults = SshSettings(user=opts.get("ssh_user"), port=opts.get("ssh_port"),
                               identity_file=opts.get("identity"))

    if opts.get("spec_file"):
        if chief or evaluator:
            raise UsageError("--chief and --evaluator cannot be combined with --spec: put them in the spec file")
        path = opts["spec_file"]
        return load_spec_text(read_text(path, "--spec"), path).cluster_spec(ssh_defaults)
    if local is not None:
        from launcher.host.ports import pick_free_ports

        with_chief = chief is THIS_MACHINE
        return ClusterSpec(tasks=local_tasks(pick_free_ports(local + with_chief), with_chief,
                                             with_evaluator=evaluator is THIS_MACHINE))
    if opts.get("hostfile"):
        path = opts["hostfile"]
        workers = expand_slots(parse_hostfile(read_text(path, "--hostfile"), path), opts["port"])
    elif opts.get("slot_hosts"):
        workers = expand_slots(opts["slot_hosts"], opts["port"])
    else:
        workers = opts["workers"]
    return ClusterSpec(tasks=build_tasks(chief, workers, evaluator, opts["port"]), ssh_defaults=ssh_defaults)


def _slurm_spec(opts: dict, step: bool, with_chief: bool, with_evaluator: bool) -> ClusterSpec:
    """The tasks of the Slurm allocation (or job step) this process runs in."""
    from launcher.config.slurm_env import read_allocation
    from launcher.config.spec import slurm_tasks

    allocation = read_allocation(os.environ, step=step)
    tasks = slurm_tasks(allocation.nodes, allocation.tasks_per_node, opts["port"], with_chief, with_evaluator)
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
    console cannot carry them, and remote hosts would get something else than what was written."""
    names = {"env_pairs": "--env", "spec_file": "--spec"}
    values = [(names.get(key, f"--{key.replace('_', '-')}"), value) for key, value in opts.items()]
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


def make_plans(spec: ClusterSpec, run_id: str, count_gpus: bool = True, slurm: bool = False,
               opts: dict | None = None):
    """Plans for the spec. `count_gpus` False skips nvidia-smi where CUDA_VISIBLE_DEVICES is not shown;
    `slurm` plans every task as one task of a Slurm job step (this machine's GPUs do not matter).

    With `opts` (a command's options), remote host names are replaced in TF_CONFIG by the
    HostName the ssh config gives them, unless --keep-host-names (not under Slurm: no SSH there).
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
        resolved=ssh_config_addresses(spec, local_hosts, opts) if opts is not None and not slurm else None,
    )


def ssh_config_addresses(spec: ClusterSpec, local_hosts: frozenset[str], opts: dict) -> dict[str, str]:
    """Remote host name -> the ssh config's HostName for it (I/O: reads the config file)."""
    from launcher.config.addresses import is_loopback

    if opts.get("keep_host_names"):
        return {}
    remote = sorted({t.host for t in spec.tasks if t.host not in local_hosts and not is_loopback(t.host)})
    path = os.path.expanduser(opts.get("ssh_config") or "~/.ssh/config")
    if not remote or not os.path.exists(path):
        return {}  # nothing to look up: do not load paramiko
    from launcher.runners.ssh.target import hostname_addresses

    return hostname_addresses(remote, opts.get("ssh_config"))


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


def with_task_settings(spec: ClusterSpec, opts: dict) -> ClusterSpec:
    """The spec with launch's --env, --env-file, --forward-env, --workdir, --python, threads and GPUs over it."""
    from launcher.config.envfile import parse_env_file

    given: dict[str, str] = {}
    if opts.get("env_file"):
        given.update(parse_env_file(read_text(opts["env_file"], "--env-file"), opts["env_file"]))
    for pattern in opts.get("forward_env", ()):
        if pattern.endswith("*"):  # a prefix: whatever of it is set here, maybe nothing
            names = sorted(name for name in os.environ if name.startswith(pattern[:-1]))
        elif pattern in os.environ:
            names = [pattern]
        else:
            raise UsageError(f"--forward-env {pattern}: {pattern} is not set in this environment")
        for name in names:
            _check_one_text(f"--forward-env {name}", os.environ[name])
            given[name] = os.environ[name]
    given.update(opts.get("env_pairs", ()))
    env = {**spec.env, **given}
    gpus = opts.get("gpus_per_task")
    return dataclasses.replace(
        spec,
        env=env,
        secret_env=spec.secret_env | frozenset(given),
        workdir=opts.get("workdir") or spec.workdir,
        python=opts.get("python") or spec.python,
        threads_per_task=opts.get("threads_per_task") or spec.threads_per_task,
        gpus_per_task=gpus if gpus is not None else spec.gpus_per_task,
        legacy_keras=bool(opts.get("legacy_keras")) or spec.legacy_keras,
    )


def ssh_options_from(opts: dict) -> SshOptions:
    """SshOptions from the parsed options; those a command does not have keep their defaults."""
    defaults = SshOptions()
    grace = opts.get("grace_period")
    return SshOptions(
        known_hosts=opts.get("known_hosts") or None,
        accept_new_host_keys=bool(opts.get("accept_new_host_keys")),
        ssh_config=opts.get("ssh_config") or None,
        connect_timeout=float(opts.get("connect_timeout") or defaults.connect_timeout),
        kill_grace=math.ceil(grace) if grace is not None else defaults.kill_grace,
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
