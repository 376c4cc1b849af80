"""Options shared by the commands, and the translation of click's keyword arguments, once per
command, into the typed objects the rest of mgpu takes: the requests that intake/load.py reads
(HostsRequest, TaskSettings, HostNaming), LaunchOptions and SshOptions."""

from __future__ import annotations

import dataclasses
import pathlib

import click

from launcher.cli import params
from launcher.host.files import MAX_KNOWN_HOSTS_BYTES as KNOWN_HOSTS_LIMIT
from launcher.cli.command_line import recorded
from launcher.cli.main import GIVEN_ARGS, debug_flag
from launcher.intake.load import (
    THIS_MACHINE, HostNaming, HostsRequest, SlurmScope, TaskSettings, check_text_value,
)
from launcher.config.spec import ClusterSpec, SshSettings
from launcher.errors import UsageError
from launcher.launch_options import LaunchOptions
from launcher.backends.ssh.options import SshOptions
from launcher.exit_codes import DEFAULTS as DEFAULT_EXIT_CODES, ExitCodes
from launcher.supervise.options import DEFAULT_REJOIN_INTERVAL, DEFAULT_STALL_TIMEOUT, SuperviseOptions


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
        click.option("--ps-hosts", type=params.ENDPOINT_LIST, metavar="HOST[:PORT],...",
                     help="Parameter servers (task type 'ps') for ParameterServerStrategy; needs a chief, "
                          "its coordinator."),
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
                     metavar="SECONDS", help="Timeout for each SSH connection (the remote login shell then has at least 60 s to start a task)."),
        click.option("--keepalive", type=params.Seconds(0.1), default=None, metavar="SECONDS",
                     help="Seconds between SSH keepalives; a host that answers none of 3 in a row counts as lost. "
                          "[default: 15]"),
        click.option("--host-agent/--no-host-agent", default=True, show_default=True,
                     help="One SSH session per host starts all of its tasks, in every attempt: the session of its "
                          "checks goes on as the host's agent (no login per task, none at a restart). "
                          "--no-host-agent: a login per task, for hosts whose python3 cannot run the agent."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


# The flag that asks for each scope of a Slurm job.
SLURM_FLAGS = {SlurmScope.ALLOCATION: "--slurm", SlurmScope.STEP: "--from-slurm"}


def hosts_request(opts: dict, local: int | None = None, slurm: SlurmScope | None = None) -> HostsRequest:
    """The HostsRequest of a command's options; UsageError, in the words of the flags, when the
    sources conflict or --chief/--evaluator take a value where they cannot (or lack one)."""
    sources = [name for name, given in (("--workers", opts.get("workers")), ("--hosts", opts.get("slot_hosts")),
                                        ("--hostfile", opts.get("hostfile")), ("--spec", opts.get("spec_file")),
                                        ("--local", local is not None), (slurm and SLURM_FLAGS[slurm], slurm)) if given]
    if len(sources) > 1:
        raise UsageError(f"give only one of {' and '.join(sources)}")
    if not sources:
        raise UsageError("no hosts: give --workers, --hosts, --hostfile, --spec, --local or --slurm")
    chief, evaluator = opts.get("chief"), opts.get("evaluator")
    flag_mode = "--local" if local is not None else slurm and SLURM_FLAGS[slurm]  # where --chief, --evaluator take no value
    for flag, value in (("--chief", chief), ("--evaluator", evaluator)):
        if flag_mode is None and value is THIS_MACHINE:
            raise UsageError(f"{flag} needs a host here (it takes no value only with --local or --slurm)")
        if flag_mode is not None and value not in (None, THIS_MACHINE):
            raise UsageError(f"with {flag_mode}, {flag} takes no value: "
                             + ("every task runs on this machine" if local is not None else "the allocation says where"))
    if opts.get("spec_file") and (chief or evaluator):
        raise UsageError("--chief and --evaluator cannot be combined with --spec: put them in the spec file")
    ps_hosts, ps_count = opts.get("ps_hosts"), opts.get("ps")
    if ps_count and local is None:
        raise UsageError("--ps N goes with --local; give the parameter servers' hosts with --ps-hosts "
                         "(or 'ps:' in a spec's cluster)")
    if ps_hosts and (local is not None or slurm or opts.get("spec_file")):
        raise UsageError(f"--ps-hosts cannot be combined with {sources[0]}: "
                         + ("give --ps N" if local is not None else
                            "put them in the spec's cluster" if opts.get("spec_file") else
                            "parameter servers are not planned in a Slurm allocation"))
    return HostsRequest(
        workers=opts.get("workers"), slot_hosts=opts.get("slot_hosts"), hostfile=opts.get("hostfile"),
        spec_file=opts.get("spec_file"), local=local, slurm=slurm, chief=chief, evaluator=evaluator,
        ps_hosts=ps_hosts or (), ps=ps_count or 0,
        port=opts.get("port", 2222),
        ssh_defaults=SshSettings(user=opts.get("ssh_user"), port=opts.get("ssh_port"), identity_file=opts.get("identity")),
        spares=tuple(opts.get("spare_hosts") or ()) if slurm else ())


def check_text(opts: dict, command: tuple[str, ...] = ()) -> None:
    """Refuse arguments with NUL characters or bytes that are not UTF-8: the environment and the
    console cannot carry them, and remote hosts would get something else than what was written.
    Each is named by its flag, as the running command declares it."""
    context = click.get_current_context(silent=True)
    flags = {param.name: param.opts[0] for param in (context.command.params if context else ())}
    values = [(flags.get(key, key), value) for key, value in opts.items() if key != "env_pairs"]
    values += [("the command", arg) for arg in command]
    for option, value in values:
        for text in _strings(value):
            check_text_value(option, text)
    for name, value in opts.get("env_pairs", ()):  # a value is named by its variable, never shown
        check_text_value(f"{flags.get('env_pairs', '--env')} {name}", value, secret=True)


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list, frozenset)):
        return [text for item in value for text in _strings(item)]
    return []


def host_naming(opts: dict) -> HostNaming:
    return HostNaming(opts.get("ssh_config") or None, bool(opts.get("keep_host_names")))


def task_settings(opts: dict) -> TaskSettings:
    return TaskSettings(tuple(opts.get("env_pairs", ())), opts.get("env_file"), tuple(opts.get("forward_env", ())),
                        opts.get("workdir"), opts.get("python"), opts.get("threads_per_task"),
                        opts.get("gpus_per_task"), bool(opts.get("legacy_keras")),
                        opts.get("sync"), opts.get("setup"), opts.get("setup_timeout"))


def ssh_options_from(opts: dict) -> SshOptions:
    """SshOptions from the parsed options; those a command does not have keep their defaults."""
    defaults = SshOptions()
    return SshOptions(
        known_hosts=opts.get("known_hosts") or None,
        accept_new_host_keys=bool(opts.get("accept_new_host_keys")),
        ssh_config=opts.get("ssh_config") or None,
        connect_timeout=float(opts.get("connect_timeout") or defaults.connect_timeout),
        keepalive=float(opts.get("keepalive") or defaults.keepalive),
        host_agent=bool(opts.get("host_agent", defaults.host_agent)),
        debug=debug_flag(click.get_current_context(silent=True)),
    )


spare_hosts_option = click.option(
    "--spare-hosts", type=params.HOST_LIST, metavar="HOST,...",
    help="Hosts that take the tasks of a host lost during the run (same task types and indices), "
         "in this order; checked like the others (spec: `spares:`). With --slurm: nodes of the allocation "
         "that no task uses until then.")

min_hosts_option = click.option(
    "--min-hosts", type=params.Count(min=1), metavar="N",
    help="When a host is left out during the run (lost, unreachable, the same failure twice, --leave-out-slow) "
         "and no spare is left, go on without it while N or more hosts remain: the plans are made again for "
         "the hosts left and the whole cluster restarts from its checkpoint (needs --max-restarts; spec: "
         "`min_hosts:`). Every task gets MGPU_WORLD_SIZE_MAX, the job's planned size.")

rejoin_interval_option = click.option(
    "--rejoin-interval", type=params.Seconds(0), default=DEFAULT_REJOIN_INTERVAL, show_default=True,
    metavar="SECONDS",
    help="With --min-hosts: probe a host the run went on without (a login and the host check, in the "
         "background) at most this often; once it passes it joins at the next restart, or right after the next "
         "'MGPU_CHECKPOINT <step>' line a task prints. A host taken back that fails again stays out. 0: never.")

# What the pre-launch checks find is also what sets each task's NCCL and Gloo interface: skipping
# them leaves the frameworks to pick one themselves (Gloo: the address the host's name resolves to).
no_check_option = click.option(
    "--no-check", is_flag=True,
    help="Skip the pre-launch checks: remote hosts' Python, program and requirements, the network test "
         "between tasks, the speed probe. The network test is also what chooses each task's interface for "
         "NCCL and Gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), so with --no-check neither is set: "
         "PyTorch's Gloo then listens where the host's name resolves (127.0.1.1 on Debian), which other "
         "hosts cannot reach; set them with --env where that is so.")


def with_spare_hosts(spec: ClusterSpec, opts: dict) -> ClusterSpec:
    """The spec with the command line's --spare-hosts, which win over the spec file's `spares:`."""
    from launcher.config.spec import with_spares

    spares = opts.get("spare_hosts")
    return with_spares(spec, spares if spares is not None else spec.spares)


def with_min_hosts(spec: ClusterSpec, opts: dict) -> ClusterSpec:
    """The spec with the command line's --min-hosts, which wins over the spec file's `min_hosts:`;
    a number the run cannot meet, or one without restarts to go on with, is bad input."""
    min_hosts = opts.get("min_hosts") if opts.get("min_hosts") is not None else spec.min_hosts
    if min_hosts is None:
        return spec
    hosts = len({task.host for task in spec.tasks})
    if min_hosts > hosts:
        raise UsageError(f"--min-hosts {min_hosts}: the run has {hosts} host{'s' if hosts != 1 else ''}")
    if not opts.get("max_restarts"):
        raise UsageError(f"--min-hosts {min_hosts} goes on with fewer hosts by restarting the cluster: "
                         f"give --max-restarts too")
    return dataclasses.replace(spec, min_hosts=min_hosts)


def exit_codes_of(opts: dict, spec: ClusterSpec) -> ExitCodes:
    """The defaults, the spec's `exit_codes:` over them, and --exit-codes over both, code by code."""
    return DEFAULT_EXIT_CODES.over(spec.exit_codes).over(opts.get("exit_codes") or ())


def _tensorboard(folder: str | None) -> pathlib.Path | None:
    """--tensorboard's folder; refused before anything starts where tensorboardX is not installed
    (looked up, not imported: only the supervisor of such a run imports it)."""
    if not folder:
        return None
    import importlib.util

    if importlib.util.find_spec("tensorboardX") is None:
        raise UsageError("--tensorboard needs tensorboardX, which is not installed: pip install tensorboardX")
    return pathlib.Path(folder)


def recorded_command_line(show_secrets: bool) -> tuple[str, ...]:
    """The command line as given (the root context's), its secrets hidden, for run.json; none where
    the options were made outside a command (by a program of the user's calling this module)."""
    context = click.get_current_context(silent=True)
    return recorded(context.meta.get(GIVEN_ARGS, ()) if context is not None else (), show_secrets)


def launch_options_from(opts: dict, run_id: str, spec: ClusterSpec) -> LaunchOptions:
    stall_timeout = next((value for value in (opts.get("stall_timeout"), spec.stall_timeout) if value is not None),
                         DEFAULT_STALL_TIMEOUT)
    if opts.get("worker_restarts") and opts.get("slurm"):  # a Slurm step's tasks start and end together
        raise UsageError("--worker-restarts restarts a task on its own, which a Slurm step cannot: not with --slurm")
    return LaunchOptions(
        supervise=SuperviseOptions(
            run_id=run_id,
            log_dir=pathlib.Path(opts["log_dir"]),
            grace_period=opts["grace_period"],
            start_timeout=opts["start_timeout"],
            stall_timeout=stall_timeout,
            slow_window=opts["slow_window"],
            max_restarts=opts["max_restarts"],
            min_hosts=spec.min_hosts or 0,
            rejoin_interval=opts.get("rejoin_interval", DEFAULT_REJOIN_INTERVAL),
            worker_restarts=opts.get("worker_restarts") or 0,
            timestamps=opts["timestamps"],
            show=opts["show"],
            show_tf_logs=opts["show_tf_logs"],
            show_secrets=opts["show_secrets"],
            exit_codes=exit_codes_of(opts, spec),
            notify=opts.get("notify"),
            notify_url=opts.get("notify_url"),
            tensorboard=_tensorboard(opts.get("tensorboard") or spec.tensorboard),
            command_line=recorded_command_line(opts["show_secrets"]),
        ),
        ssh=ssh_options_from(opts),
        check_hosts=not opts["no_check"],
        allow_public=opts["allow_public"],
        leave_out_slow=opts["leave_out_slow"],
        detach=opts["detach"],
        quarantine=opts.get("quarantine", 0.0),
        health_check=opts.get("health_check") or spec.health_check,
        health_check_timeout=opts.get("health_check_timeout") or spec.health_check_timeout,
    )
