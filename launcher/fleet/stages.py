"""How hosts are made ready to run tasks: one list of stages, run in order by `prepare`, for the
first start (every host), a spare that takes a host's tasks, and a slow host's swap.

Each stage looks at the tasks of the hosts being prepared, or at every task where a new placement
changes them all (a spare's address is in every task's TF_CONFIG). At the first start a stage that
fails ends the launch with its error; for spares, it leaves the spare out (said in a notice) and
the stages after it are not run: the fleet tries the next spare.

The order matters: a command line no remote shell can take is refused before any connection; the
program and its requirements are copied and set up before the health check and the checks, which
look for them; the checks find each task's interface, and their sessions are kept to start each
host's first task.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from launcher.backends.ssh.remote_command import MAX_COMMAND_BYTES, longest_start_command
from launcher.backends.base import Backend
from launcher.config.quarantine import HEALTH_CHECK
from launcher.errors import CheckFailed, MgpuError, UsageError
from launcher.fleet.backends import sync_to_hosts
from launcher.plan.network import with_interfaces
from launcher.plan.planner import LEGACY_KERAS_ENV, TaskPlan
from launcher.preflight.check import (check_hosts_and_reach, close_handovers, handovers_of, local_tensorflow_version,
                                      run_checks)
from launcher.preflight import check_json
from launcher.preflight.exposure import exposure_warnings
from launcher.preflight.on_host import by_host
from launcher.preflight.reach import reachable_interfaces
from launcher.fleet.setup import run_setup
from launcher.preflight.speed import HostSpeed, spans_hosts
from launcher.supervise import causes
from launcher.supervise.rundir import make_run_dir

if TYPE_CHECKING:
    from launcher.launch_options import LaunchOptions
    from launcher.supervise.rundir import RunDir


class Hosts(Protocol):
    """What the stages use of the fleet they make ready (fleet.Fleet is one)."""

    options: "LaunchOptions"
    run_dir: "RunDir | None"  # made by the --setup's stage, for its logs
    ssh: Backend | None  # the run's SSH backend, once a stage opened it
    made_ready: set[str]  # hosts that have the --sync folder and ran the --setup

    def open_ssh(self) -> Backend: ...

    def backend_for(self, plan: TaskPlan) -> Backend: ...

    def remember_left_out(self, why: dict[str, str], notice: Callable[[str], None]) -> None: ...


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What `prepare` made of the plans."""

    plans: tuple[TaskPlan, ...]  # every task of the run, with the interfaces the checks found
    failed: tuple[str, ...] = ()  # hosts being prepared that failed a stage (spares: skipped)
    gone: tuple[str, ...] = ()  # peers the spares' checks found gone: their fault, not the spares'
    speeds: tuple[HostSpeed, ...] = ()  # the speed probe's figures (the first start, on more than one host)
    handed_over: tuple[str, ...] = ()  # hosts whose check sessions go on to start their first task (a handover)
    unhealthy: tuple[tuple[str, str], ...] = ()  # the first start's hosts that failed the health check, and why
    checks: dict | None = None  # the first start's host checks' table (preflight/check_json.py), where they ran

    @property
    def ok(self) -> bool:
        return not self.failed and not self.gone


@dataclasses.dataclass
class Preparing:
    """The preparation under way: what each stage reads and leaves for the next."""

    fleet: Hosts
    plans: list[TaskPlan]  # every task of the run, as placed
    hosts: tuple[str, ...]  # the hosts being made ready
    notice: Callable[[str], None]
    first: bool  # the first start: a failure ends the launch
    failed: list[str] = dataclasses.field(default_factory=list)
    gone: list[str] = dataclasses.field(default_factory=list)
    speeds: list[HostSpeed] = dataclasses.field(default_factory=list)
    handed_over: tuple[str, ...] = ()
    unhealthy: dict[str, str] = dataclasses.field(default_factory=dict)  # the first start's: its fleet leaves them out
    checks: dict | None = None

    def mine(self) -> list[TaskPlan]:
        """The tasks of the hosts being made ready."""
        return [plan for plan in self.plans if plan.host in self.hosts]

    def remote(self) -> list[TaskPlan]:
        return [plan for plan in self.mine() if not plan.local]

    def refuse(self, hosts: Sequence[str], error: MgpuError) -> None:
        """`hosts` failed a stage: the first start ends with the error; spares are left out."""
        if self.first:
            raise error
        for host in hosts:
            if host not in self.failed:
                self.notice(f"spare host {host} failed its checks: {str(error).splitlines()[0]}")
                self.failed.append(host)


Stage = Callable[[Preparing], None]


def prepare(fleet: Hosts, plans: Sequence[TaskPlan], hosts: Sequence[str], notice: Callable[[str], None],
            first: bool = False) -> Prepared:
    """Run the fleet's stages on `hosts` of `plans`, in order, up to the first that fails one."""
    state = Preparing(fleet, list(plans), tuple(dict.fromkeys(hosts)), notice, first)
    for stage in fleet.stages:
        stage(state)
        if state.failed or state.gone:
            break
    return Prepared(tuple(state.plans), tuple(state.failed), tuple(state.gone), tuple(state.speeds), state.handed_over,
                    tuple(state.unhealthy.items()), state.checks)


# -- the stages, in the order a launch on this machine and SSH hosts runs them --------------------

def check_workdirs(state: Preparing) -> None:
    """A workdir missing on this machine is bad input, not a program that cannot start."""
    for plan in state.mine():
        if plan.local and plan.workdir and not os.path.isdir(plan.workdir):
            problem = "is not a directory" if os.path.exists(plan.workdir) else "does not exist"
            state.refuse([plan.host], UsageError(f"workdir {plan.workdir} {problem} on this machine "
                                                 f"({plan.name} runs here)"))


def check_command_lengths(state: Preparing) -> None:
    """A command line the remote shell cannot take is refused before connecting anywhere. Every
    remote task is measured: a spare's address is in the TF_CONFIG of every task."""
    grace_period = state.fleet.options.supervise.grace_period
    for plan in state.plans:
        if plan.local:
            continue
        command = longest_start_command(plan.argv, plan.env, plan.workdir, grace_period, plan.port,
                                        plan.coordinator_port)
        size = len(command.encode("utf-8", "surrogateescape"))
        if size > MAX_COMMAND_BYTES:
            state.refuse(state.hosts, UsageError(
                f"{plan.name}: the command line is {size} bytes; a remote host takes at most "
                f"{MAX_COMMAND_BYTES} (pass long arguments in a file)"))
            return


def open_ssh(state: Preparing) -> None:
    """The run's SSH backend, once a task runs on a remote host."""
    if any(not plan.local for plan in state.plans):
        state.fleet.open_ssh()


def warn_about_exposure(state: Preparing) -> None:
    """Warn about every task of the hosts, local ones too: TensorFlow's server listens on all
    interfaces. Remote ssh-config aliases are judged by the address they really reach."""
    if state.fleet.options.allow_public:
        return
    ssh = state.fleet.ssh
    for warning in exposure_warnings(state.mine(), ssh.resolved_address if ssh is not None else None):
        print(f"mgpu: warning: {warning}", file=sys.stderr, flush=True)


def check_health(state: Preparing) -> None:
    """`--health-check` on the hosts not yet made ready: at the first start a host that fails it is
    set apart for the fleet to leave out (a spare takes its tasks, or the launch ends naming it); a
    spare that fails it is skipped. Either is quarantined."""
    command = state.fleet.options.health_check
    if not command:
        return
    from launcher.preflight.health import unhealthy_hosts

    unhealthy = unhealthy_hosts(state.mine(), command, state.fleet.ssh,
                                timeout=state.fleet.options.health_check_timeout)
    if state.first:
        state.unhealthy.update(unhealthy)
        return
    for host, why in unhealthy.items():
        state.refuse([host], CheckFailed(f"its health check failed: {why}"))
    state.fleet.remember_left_out({host: f"{HEALTH_CHECK}: {why}" for host, why in unhealthy.items()}, state.notice)


def sync(state: Preparing) -> None:
    """The --sync folder to each remote host not yet made ready: all at once at the first start,
    each spare on its own (one that cannot take it is skipped)."""
    todo = [plan for plan in state.remote() if plan.host not in state.fleet.made_ready]
    if not todo:  # no remote host: the SSH side (paramiko) is never loaded
        return
    for group in ([todo] if state.first else by_host(todo)):
        try:
            sync_to_hosts(group, state.fleet.ssh)
        except MgpuError as e:
            state.refuse([group[0].host], e)


def set_up(state: Preparing) -> None:
    """--setup once on every host not yet made ready, as a task (its logs in the run's folder, made
    here at the first start and continued by supervision). A spare's setup leaves the run's signals
    to the supervisor, which stops the run once the setup is over."""
    fleet = state.fleet
    if state.first:
        if state.plans and state.plans[0].setup is not None:
            fleet.run_dir = make_run_dir(fleet.options.supervise)
            run_setup(state.plans, fleet.backend_for, fleet.run_dir, fleet.options.supervise.grace_period)
    elif fleet.run_dir is not None:
        for group in by_host(plan for plan in state.remote() if plan.host not in fleet.made_ready):
            try:
                run_setup(group, fleet.backend_for, fleet.run_dir, fleet.options.supervise.grace_period,
                          stop_on_signals=False)
            except MgpuError as e:
                state.refuse([group[0].host], e)
    fleet.made_ready.update(host for host in state.hosts if host not in state.failed)


def check(state: Preparing) -> None:
    """The hosts' checks (the program, its requirements) and the reachability test of every task,
    which finds each task's interface for NCCL and Gloo (unless the user chose one); at the first
    start on more than one host, the speed probe too. One session per host, kept to start its first
    task."""
    if not state.fleet.options.check_hosts:
        return
    if state.first:
        reports, reachability, speeds = run_checks(state.remote(), state.fleet.ssh, reach=state.plans,
                                                   speed=spans_hosts(state.plans), handover=True)
        state.speeds = list(speeds)
        state.checks = check_json.document(reports, speeds, reachability.problems) if reports else None
        state.plans = with_interfaces(state.plans, reachable_interfaces(reachability), frozenset(os.environ))
        state.handed_over = tuple(dict.fromkeys(plan.host for plan in state.remote()))
        return
    _check_spares(state)


def _check_spares(state: Preparing) -> None:
    """The spares' checks beside the run's other tasks: a spare that fails is left out; a peer the
    test finds gone (causes.check_fault) is the peer's fault, not the spares'."""
    on_spares, ssh = state.remote(), state.fleet.ssh
    started = time.monotonic()
    reports, reachability, _ = check_hosts_and_reach(on_spares, state.plans, ssh, local_tensorflow_version(),
                                                     handover=True)
    if all(report.ok for report in reports):  # as run_checks says it
        print(f"mgpu: checked {len(reports)} host(s) in {time.monotonic() - started:.1f} s: ok", file=sys.stderr,
              flush=True)
    for report in reports:
        if not report.ok:
            state.refuse([report.host], MgpuError(report.reason))
    if not state.failed and reachability.problems:
        tested = list(dict.fromkeys(plan.host for plan in state.plans if plan.port is not None))
        at_fault, gone = causes.check_fault(tested, state.hosts, reachability.unreached, reachability.cut)
        state.gone = [host for host in gone if not any(plan.local for plan in state.plans if plan.host == host)]
        # A check that charges no one charges the spares, as any other failed check does.
        state.refuse(list(at_fault) if at_fault or state.gone else state.hosts,
                     MgpuError(f"tasks cannot reach each other: {reachability.problems[0]}"))
        for peer in state.gone:
            how = "cannot log in to it" if peer in reachability.unreached else "reaches no task of it"
            state.notice(f"{peer} is gone too: the spares' check {how}; it is left out, not the spares")
    if state.failed or state.gone:
        close_handovers(reports)
        return
    ssh.take_handovers(handovers_of(reports))
    state.plans = with_interfaces(state.plans, reachability.interfaces, frozenset(os.environ))
    state.handed_over = tuple(dict.fromkeys(plan.host for plan in on_spares))


def check_local_tf_keras(state: Preparing) -> None:
    """With --legacy-keras, this machine's tasks need tf_keras too: checked before starting anything."""
    local = [plan for plan in state.mine() if plan.local and plan.env.get(LEGACY_KERAS_ENV) == "1"]
    if local and state.fleet.options.check_hosts:
        try:
            run_checks(local, None)
        except MgpuError as e:
            state.refuse(sorted({plan.host for plan in local}), e)


# The stages of a run on this machine and SSH hosts.
STAGES: tuple[Stage, ...] = (check_workdirs, check_command_lengths, open_ssh, warn_about_exposure, sync, set_up,
                             check_health, check, check_local_tf_keras)
# The stages of a run in a Slurm allocation: Slurm copies nothing and checks its nodes itself.
SLURM_STAGES: tuple[Stage, ...] = (warn_about_exposure,)
