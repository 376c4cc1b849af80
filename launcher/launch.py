"""Executing a plan: check the run can start, pick a backend per task, copy the --sync folder to the
remote hosts and run --setup on every host, check the hosts, then supervise."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from typing import Callable, Sequence

from launcher.config.addresses import parse_endpoint
from launcher.config.slurm_env import read_allocation
from launcher.config.spec import with_host_replaced
from launcher.errors import MgpuError, UsageError
from launcher.launch_options import LaunchOptions
from launcher.plan.network import with_interfaces
from launcher.plan.planner import LEGACY_KERAS_ENV, TaskPlan, in_step_order
from launcher.preflight.check import (check_hosts_and_reach, close_handovers, handovers_of, local_tensorflow_version,
                                      run_checks)
from launcher.preflight.exposure import exposure_warnings
from launcher.preflight.reach import probe_reachability, reachable_interfaces
from launcher.preflight.run_id import check_run_id_unused
from launcher.preflight.setup import run_setup
from launcher.preflight.speed import spans_hosts, warn_about_slow_hosts
from launcher.backends.base import DEFAULT_GRACE_PERIOD, Routed
from launcher.backends.local import LocalBackend
from launcher.backends.slurm import SlurmBackend
from launcher.backends.ssh.options import SshOptions
from launcher.backends.ssh.remote_command import MAX_COMMAND_BYTES, task_command
from launcher.supervise import causes, detach, run_lock
from launcher.supervise.hosts import Placement
from launcher.supervise.policy import place_on_spares
from launcher.supervise.options import DEFAULT_LOG_DIR
from launcher.supervise.rundir import CONSOLE_LOG, check_run_dir, make_run_dir
from launcher.supervise.supervisor import HostActions, supervise


def launch(plans: Sequence[TaskPlan], options: LaunchOptions) -> int:
    """Run the plans to their end; the exit code of `mgpu launch` when it ends without an error (0,
    or for a detached launch the code of its supervisor if that ended before the run began)."""
    detached = None
    if options.detach:
        forked = detach.fork()
        if isinstance(forked, int):
            if forked == 0:
                _announce(options)
            return forked
        detached = forked.let_go
    # The run id stays claimed on this machine from the check that no process carries it until the
    # run's last sweep is done.
    with run_lock.claimed(options.supervise.run_id):
        # A run id or log dir that cannot be used fails before any connection.
        check_run_dir(options.supervise)
        check_run_id_unused(options.supervise.run_id)
        _launch(plans, options, detached)
    return 0


def _announce(options: LaunchOptions) -> None:
    """What a detached launch prints once its run has begun: the run id and how to follow it."""
    run_id = options.supervise.run_id
    log_dir = options.supervise.log_dir
    where = "" if str(log_dir) == DEFAULT_LOG_DIR else f" --log-dir {shlex.quote(str(log_dir))}"
    detach.announce(f"mgpu: run {run_id} goes on detached; its console is in {log_dir / run_id / CONSOLE_LOG}\n"
                    f"  mgpu status {run_id}{where}        its state and progress\n"
                    f"  mgpu logs {run_id}{where} -f       follow its console to the end\n"
                    f"  mgpu attach {run_id}{where}        its live console (Ctrl-C leaves it running)\n"
                    f"  mgpu stop {run_id}{where}          stop it")


def _launch(plans: Sequence[TaskPlan], options: LaunchOptions, detached: Callable[[], None] | None) -> None:
    if any(plan.slurm_rank is not None for plan in plans):
        _launch_slurm(plans, options)
        return

    _check_local_workdirs(plans)
    local = [plan for plan in plans if plan.local]
    local_backend = LocalBackend() if local else None
    backends = [local_backend] if local_backend is not None else []
    remote = [plan for plan in plans if not plan.local]
    ssh_backend = None
    run_dir = None
    try:
        if remote:
            _check_remote_command_lengths(remote, options.supervise.grace_period)
            ssh_backend = make_ssh_backend(options.ssh, options.supervise.grace_period)
            backends.append(ssh_backend)
            # Remote ssh-config aliases are judged by the address they really reach.
            _warn_about_exposure(plans, ssh_backend.resolved_address, options)
            # The program and its requirements first: the checks look for them.
            _sync_to_hosts(remote, ssh_backend)
        else:
            _warn_about_exposure(plans, None, options)
        if plans[0].setup is not None:
            run_dir = make_run_dir(options.supervise)  # for the setup's logs; supervision continues it
            run_setup(plans, lambda plan: local_backend if plan.local else ssh_backend, run_dir,
                      options.supervise.grace_period)
        if options.check_hosts:
            # The remote hosts' checks, the reachability test of every task and, on more than one
            # host, the speed probe, in one session per host, which then starts the host's first task.
            reachability, speeds = run_checks(remote, ssh_backend, reach=plans, speed=spans_hosts(plans), handover=True)
            # NCCL and Gloo use the interface the other tasks dial (unless the user chose one).
            plans = with_interfaces(plans, reachable_interfaces(reachability), frozenset(os.environ))
        _check_local_tf_keras(plans, options)
        hosts = _host_actions(ssh_backend, options, run_dir)
        if options.check_hosts:
            slow = warn_about_slow_hosts(speeds)
            if slow and options.leave_out_slow:
                plans = _leave_out_slow(plans, slow, hosts)
    except BaseException:
        if run_dir is not None:
            run_dir.close()
        if ssh_backend is not None:
            ssh_backend.close()
        raise

    backend = Routed(backends, lambda plan: local_backend if plan.local else ssh_backend)
    try:
        supervise(plans, backend, options.supervise, detach=detached, run_dir=run_dir, hosts=hosts)
    finally:
        backend.close()


def _leave_out_slow(plans: Sequence[TaskPlan], slow: Sequence[str], hosts: HostActions) -> list[TaskPlan]:
    """The plans with each slow host's tasks on a spare that passed its checks, as the supervisor
    leaves out a lost host; a slow host without a spare left keeps its tasks."""
    plans = list(plans)

    def notice(text: str) -> None:
        print(f"mgpu: {text}", file=sys.stderr, flush=True)

    for host in slow:
        if any(plan.local for plan in plans if plan.host == host):
            notice(f"warning: --leave-out-slow: {host} is this machine, which is never left out; it runs its tasks")
            continue
        placement = hosts.replace([host], notice)
        if placement.plans is None:
            notice(f"warning: --leave-out-slow: no spare host (--spare-hosts) left to take the tasks of {host}; "
                   f"it runs them")
            continue
        plans, spare = list(placement.plans), placement.took[0][1]
        notice(f"left out slow host {host}: its tasks run on spare host {spare}")
    return plans


def _host_actions(ssh_backend, options: LaunchOptions, run_dir) -> HostActions:
    """What the supervisor may do about the run's hosts between attempts. A spare gets the --sync
    folder and runs the --setup (its log in `run_dir`, made for the setup) before its checks."""
    if ssh_backend is None:
        return HostActions(relaunch=lambda hosts: relaunch_command(options.argv, hosts))
    spec = options.spec
    made_ready: set[str] = set()  # spares that have the --sync folder and ran the --setup

    def replace(hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """Spares that pass the checks in place of `hosts`, each host its own, and the plans made
        again with them. A spare that fails its checks is skipped; a peer that the checks find gone
        is the peer's fault, not the spare's: it is left out too and takes a spare of its own."""
        nonlocal spec
        if spec is None or options.replan is None:
            return Placement(None)
        hosts, gone = list(hosts), []
        # Each round but the last skips a spare or leaves a peer out: bounded by their numbers.
        for _ in range(len(spec.spares) + len(spec.tasks) + 1):
            pairs = place_on_spares(hosts, spec.spares)
            if pairs is None:
                return Placement(None, gone=tuple(gone))
            changed = spec
            for host, spare in pairs:
                changed = with_host_replaced(changed, host, spare)
            spares = [spare for _, spare in pairs]
            try:
                plans = list(options.replan(changed))
            except MgpuError as e:
                notice(f"spare host {spares[0]} failed its checks: {str(e).splitlines()[0]}")
                failed, peers = [spares[0]], []
            else:
                failed, peers, plans = _check_spares(plans, spares, ssh_backend, run_dir, options.check_hosts, notice,
                                                     made_ready, options.supervise.grace_period)
            if not failed and not peers:
                spec = changed
                return Placement(plans, pairs, tuple(gone))
            spec = dataclasses.replace(spec, spares=tuple(h for h in spec.spares if h not in failed))
            hosts += peers
            gone += peers
        return Placement(None, gone=tuple(gone))

    def login_ok(plan: TaskPlan) -> bool | None:
        if plan.local:
            return None
        try:  # a connection that was lost is not reused: this is a fresh login
            code, _, _ = ssh_backend.run(plan, "true", ssh_backend.options.connect_timeout)
        except (MgpuError, OSError, EOFError):
            return False
        return code == 0

    def unreachable(plans: Sequence[TaskPlan]) -> tuple[str, str] | None:
        found = probe_reachability(plans, ssh_backend)
        return found.cut[0] if found.cut else None

    return HostActions(login_ok=login_ok, replace=replace, unreachable=unreachable,
                       relaunch=lambda hosts: relaunch_command(options.argv, hosts))


def _check_spares(plans: list[TaskPlan], spares: Sequence[str], ssh_backend, run_dir, check_hosts: bool,
                  notice: Callable[[str], None], made_ready: set[str], grace_period: float
                  ) -> tuple[list[str], list[str], list[TaskPlan]]:
    """Get each spare ready once (the --sync folder, the --setup; `made_ready` are those that are)
    and check them all, with the reachability test of every task of `plans`: the spares that
    failed, the peers found gone (causes.check_fault), and the plans with each task's interface."""
    on_spare = [plan for plan in plans if plan.host in spares and not plan.local]
    failed: list[str] = []
    for spare in spares:
        mine = [plan for plan in on_spare if plan.host == spare]
        try:
            if spare not in made_ready:
                _sync_to_hosts(mine, ssh_backend)
                if run_dir is not None:
                    # The supervisor answers for its signals meanwhile: it stops the run once the spare's setup is over.
                    run_setup(mine, lambda plan: ssh_backend, run_dir, grace_period, stop_on_signals=False)
                made_ready.add(spare)
        except MgpuError as e:
            notice(f"spare host {spare} failed its checks: {str(e).splitlines()[0]}")
            failed.append(spare)
    if failed or not check_hosts:
        return failed, [], plans
    started = time.monotonic()
    reports, reachability, _ = check_hosts_and_reach(on_spare, plans, ssh_backend, local_tensorflow_version(),
                                                     handover=True)
    if all(report.ok for report in reports):  # as run_checks says it
        print(f"mgpu: checked {len(reports)} host(s) in {time.monotonic() - started:.1f} s: ok", file=sys.stderr,
              flush=True)
    for report in reports:
        if not report.ok:
            notice(f"spare host {report.host} failed its checks: {report.reason.splitlines()[0]}")
            failed.append(report.host)
    peers: list[str] = []
    if not failed and reachability.problems:
        tested = list(dict.fromkeys(plan.host for plan in plans if plan.port is not None))
        at_fault, gone = causes.check_fault(tested, spares, reachability.unreached, reachability.cut)
        peers = [host for host in gone if not any(plan.local for plan in plans if plan.host == host)]
        # A check that charges no one charges the spares, as any other failed check does.
        failed = list(at_fault) if at_fault or peers else list(spares)
        for spare in failed:
            notice(f"spare host {spare} failed its checks: tasks cannot reach each other: "
                   f"{reachability.problems[0]}")
        for peer in peers:
            how = "cannot log in to it" if peer in reachability.unreached else "reaches no task of it"
            notice(f"{peer} is gone too: the spares' check {how}; it is left out, not the spares")
    if failed or peers:
        close_handovers(reports)
        return failed, peers, plans
    ssh_backend.take_handovers(handovers_of(reports))
    return [], [], with_interfaces(plans, reachability.interfaces, frozenset(os.environ))


# Options whose values list hosts, and those a relaunch leaves out (the run id is taken).
_HOST_LIST_OPTIONS = ("--workers", "--hosts", "--chief", "--evaluator", "--spare-hosts")
_FILE_OPTIONS = ("--spec", "--hostfile")
_DROPPED = ("--run-id",)


def relaunch_command(argv: Sequence[str], hosts: str | Sequence[str]) -> str | None:
    """`mgpu ARGS` without `hosts` in its host lists (and without the run id, which is taken); for
    hosts from a file, which file to remove them from. None without the command line."""
    if not argv:
        return None
    left_out = {hosts} if isinstance(hosts, str) else set(hosts)
    words: list[str] = []
    files: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            words.extend(argv[i:])
            break
        name, eq, value = arg.partition("=")
        takes_value = name in _HOST_LIST_OPTIONS + _FILE_OPTIONS + _DROPPED
        if takes_value and not eq:
            if i + 1 >= len(argv):
                words.append(arg)
                break
            value = argv[i + 1]
            i += 1
        i += 1
        if not takes_value:
            words.append(arg)
        elif name in _HOST_LIST_OPTIONS:
            kept = [entry for entry in value.split(",") if _entry_host(entry) not in left_out]
            if kept:
                words.extend([name, ",".join(kept)])
        elif name in _FILE_OPTIONS:
            files.append(value)
            words.extend([name, value])
    command = "mgpu " + shlex.join(words)
    if files:
        named = hosts if isinstance(hosts, str) else ", ".join(hosts)
        return f"{command}  (after removing {named} from {', '.join(files)})"
    return command


def _entry_host(entry: str) -> str | None:
    try:
        return parse_endpoint(entry).host
    except ValueError:
        return None


def _check_local_workdirs(plans: Sequence[TaskPlan]) -> None:
    """A workdir missing on this machine is bad input, not a program that cannot start."""
    for plan in plans:
        if plan.local and plan.workdir and not os.path.isdir(plan.workdir):
            problem = "is not a directory" if os.path.exists(plan.workdir) else "does not exist"
            raise UsageError(f"workdir {plan.workdir} {problem} on this machine ({plan.name} runs here)")


def _check_remote_command_lengths(remote: Sequence[TaskPlan], grace_period: float) -> None:
    """A command line the remote shell cannot take is refused before connecting anywhere."""
    for plan in remote:
        size = len(task_command(plan.argv, plan.env, plan.workdir, grace_period).command.encode("utf-8", "surrogateescape"))
        if size > MAX_COMMAND_BYTES:
            raise UsageError(f"{plan.name}: the command line is {size} bytes; a remote host takes at most "
                             f"{MAX_COMMAND_BYTES} (pass long arguments in a file)")


def _launch_slurm(plans: Sequence[TaskPlan], options: LaunchOptions) -> None:
    """Every task in one srun step of the allocation this launcher runs in."""

    _warn_about_exposure(plans, None, options)
    nodes = read_allocation(os.environ).nodes
    backend = SlurmBackend(plans, allocation_nodes=nodes)
    try:
        supervise(plans, backend, options.supervise, hosts=_slurm_node_actions(nodes, options))
    finally:
        backend.close()


def _slurm_node_actions(nodes: Sequence[str], options: LaunchOptions) -> HostActions:
    """Under Slurm, a node left out gives its tasks to a spare node of the allocation (one that no
    task uses): the plans are made again, ranked in the allocation's node order, and the next step
    excludes the node. Slurm checks its nodes itself: no login or reachability probe here."""
    spec = options.spec

    def replace(left_out: Sequence[str], notice: Callable[[str], None]) -> Placement:
        nonlocal spec
        pairs = place_on_spares(left_out, spec.spares) if spec is not None and options.replan is not None else None
        if pairs is None:
            return Placement(None)
        for node, spare in pairs:
            spec = with_host_replaced(spec, node, spare)
        return Placement(in_step_order(options.replan(spec), nodes), pairs)

    def relaunch(left_out: Sequence[str]) -> str | None:
        command = relaunch_command(options.argv, left_out)
        named, listed = ", ".join(left_out), ",".join(left_out)
        return f"{command}  (in an allocation without {named}: sbatch or salloc --exclude={listed})" if command else None

    return HostActions(replace=replace, relaunch=relaunch)


def _warn_about_exposure(plans: Sequence[TaskPlan], resolve, options: LaunchOptions) -> None:
    """Warn about every task, local ones too: TensorFlow's server listens on all interfaces."""
    if not options.allow_public:
        for warning in exposure_warnings(plans, resolve):
            print(f"mgpu: warning: {warning}", file=sys.stderr, flush=True)


def _check_local_tf_keras(plans: Sequence[TaskPlan], options: LaunchOptions) -> None:
    """With --legacy-keras, this machine's tasks need tf_keras too: check it before starting anything."""
    local = [plan for plan in plans if plan.local and plan.env.get(LEGACY_KERAS_ENV) == "1"]
    if local and options.check_hosts:
        run_checks(local, None)


def _sync_to_hosts(plans: Sequence[TaskPlan], ssh_backend) -> None:
    from launcher.preflight.sync import sync_to_hosts  # over SFTP: paramiko (see make_ssh_backend)
    sync_to_hosts(plans, ssh_backend)


def make_ssh_backend(options: SshOptions, grace_period: float = DEFAULT_GRACE_PERIOD):
    """An SSH backend; with options.debug, the log of its connections is shown too."""
    # Here, not at the top: paramiko takes a tenth of a second to import, which a run on this
    # machine alone never needs.
    from launcher.backends.ssh import backend as ssh_backend_module, transport
    if options.debug:
        transport.enable_debug_logging()
    return ssh_backend_module.SshBackend(options, grace_period)
