"""A run's hosts, as one object: those in use, the spares left, those left out and which are this
machine, with what the supervisor may ask of them between attempts (supervise.hosts.HostActions).

`Fleet` holds what every kind of run shares: the first start (`start`), a spare for each host
left out (`replace`, which plans again and runs `prepare` on the spares), a slow host's swap, and
the relaunch command. `MachineFleet` is a run on this machine and SSH hosts; `SlurmFleet` a run in
a Slurm allocation, whose spares are its nodes that no task uses.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Sequence

from launcher.backends.base import Backend, Routed
from launcher.backends.local import LocalBackend
from launcher.backends.slurm import SlurmBackend
from launcher.backends.slurm_node import ask_node_up
from launcher.config.spec import ClusterSpec, TaskSpec, with_host_replaced, with_tasks_back, without_hosts
from launcher.errors import MgpuError
from launcher.fleet.backends import make_ssh_backend
from launcher.fleet.checks_file import keep_checks
from launcher.fleet.health import leave_out_unhealthy
from launcher.fleet.quarantine import remember
from launcher.fleet.relaunch import relaunch_command
from launcher.fleet.stages import SLURM_STAGES, STAGES, Prepared, Stage, prepare
from launcher.launch_options import LaunchOptions
from launcher.plan.network import with_interfaces_of
from launcher.plan.planner import TaskPlan, in_step_order
from launcher.preflight.check import check_hosts_and_reach, local_tensorflow_version
from launcher.preflight.reach import probe_reachability
from launcher.preflight.speed import warn_about_slow_hosts
from launcher.supervise import causes
from launcher.supervise.hosts import FleetView, HostActions, Placement, place_on_spares
from launcher.supervise.resize import place
from launcher.supervise.rundir import RunDir


def say(text: str) -> None:
    """A notice of the launch before supervision has begun."""
    print(f"mgpu: {text}", file=sys.stderr, flush=True)


class Fleet(HostActions):
    """The hosts of one run, from its first start to its end; `stages` make a host ready."""

    stages: tuple[Stage, ...] = STAGES

    def __init__(self, plans: Sequence[TaskPlan], options: LaunchOptions):
        self.options = options
        self.plans = list(plans)  # the tasks as they are placed now
        self.spec = options.spec  # what they were planned from; its spares are those left
        self.left_out: list[str] = []  # every host whose tasks went to a spare
        self.made_ready: set[str] = set()  # hosts that have the --sync folder and ran the --setup
        self.run_dir: RunDir | None = None  # made by the first start's --setup, for its logs
        self.ssh = None  # the run's SSH backend, once a task or a spare is remote
        self.dropped: dict[str, tuple[TaskSpec, ...]] = {}  # hosts the run went on without, and their tasks

    # -- as data -----------------------------------------------------------------------

    @property
    def in_use(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(plan.host for plan in self.plans))

    @property
    def this_machine(self) -> frozenset[str]:
        return frozenset(plan.host for plan in self.plans if plan.local)

    @property
    def spares(self) -> tuple[str, ...]:
        """The spares left that can take a host's tasks (none when the run cannot plan again)."""
        return self.spec.spares if self.spec is not None and self.options.replan is not None else ()

    def view(self, plans: Sequence[TaskPlan]) -> FleetView:
        return FleetView.of(plans, self.spares)

    # -- the pipeline ------------------------------------------------------------------

    def prepare(self, plans: Sequence[TaskPlan], hosts: Sequence[str], notice: Callable[[str], None] = say,
                first: bool = False) -> Prepared:
        """`hosts` of `plans` made ready to run their tasks (stages.py)."""
        return prepare(self, plans, hosts, notice, first)

    def start(self) -> list[TaskPlan]:
        """Every host made ready for the first attempt (an error ends the launch); with
        --leave-out-slow, a slow host's tasks given to a spare. The plans to start."""
        prepared = self.prepare(self.plans, self.in_use, first=True)
        self.plans = list(prepared.plans)
        if prepared.checks is not None:
            keep_checks(self, prepared.checks, say)
        if prepared.unhealthy:
            leave_out_unhealthy(self, dict(prepared.unhealthy), say)
        if self.options.check_hosts:
            slow = warn_about_slow_hosts(prepared.speeds)
            if slow and self.options.leave_out_slow:
                self.leave_out_slow(slow)
        return self.plans

    def leave_out_slow(self, slow: Sequence[str], notice: Callable[[str], None] = say) -> None:
        """Each slow host's tasks on a spare that passed its checks, as a lost host's; a slow host
        without a spare left is left out while --min-hosts hosts remain (the plans made again for the
        others); else it keeps its tasks, as this machine always does."""
        for host in slow:
            if host in self.this_machine:
                notice(f"warning: --leave-out-slow: {host} is this machine, which is never left out; it runs its tasks")
                continue
            placement = self.replace([host], notice)
            if placement.plans is None:
                min_hosts = self.options.supervise.min_hosts
                if place([host], self.view(self.plans), min_hosts).goes_on and self.shrink([host], notice).plans:
                    notice(f"left out slow host {host}: no spare host left to take its tasks; the run goes on on "
                           f"{len(self.in_use)} of {self.spec.planned_hosts} hosts (--min-hosts {min_hosts})")
                    continue
                notice(f"warning: --leave-out-slow: no spare host (--spare-hosts) left to take the tasks of {host}; "
                       f"it runs them")
                continue
            notice(f"left out slow host {host}: its tasks run on spare host {placement.took[0][1]}")

    # -- between attempts --------------------------------------------------------------

    def replace(self, hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """Spares that pass `prepare` in place of `hosts`, each host its own, and the plans made
        again with them. A spare that fails is skipped; a peer that the checks find gone is the
        peer's fault, not the spare's: it is left out too and takes a spare of its own."""
        if not self.spares:
            return Placement(None)
        hosts, gone = list(hosts), []
        # Each round but the last skips a spare or leaves a peer out: bounded by their numbers.
        for _ in range(len(self.spec.spares) + len(self.spec.tasks) + 1):
            pairs = place_on_spares(hosts, self.spec.spares)
            if pairs is None:
                return Placement(None, gone=tuple(gone))
            changed = self.spec
            for host, spare in pairs:
                changed = with_host_replaced(changed, host, spare)
            spares = [spare for _, spare in pairs]
            try:
                plans = self.planned(changed)
            except MgpuError as e:
                notice(f"spare host {spares[0]} failed its checks: {str(e).splitlines()[0]}")
                prepared = Prepared((), failed=(spares[0],))
            else:
                prepared = self.prepare(plans, spares, notice)
            if prepared.ok:
                self.spec, self.plans = changed, list(prepared.plans)
                self.left_out.extend(host for host in hosts if host not in self.left_out)
                return Placement(self.plans, pairs, tuple(gone))
            self.spec = dataclasses.replace(self.spec, spares=tuple(h for h in self.spec.spares
                                                                    if h not in prepared.failed))
            hosts += prepared.gone
            gone += prepared.gone
        return Placement(None, gone=tuple(gone))

    def shrink(self, hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """The plans made again without `hosts` (spec.without_hosts): the run goes on on the hosts
        left, which are ready already and keep the interfaces their checks found."""
        if self.spec is None or self.options.replan is None:
            return Placement(None)
        changed = without_hosts(self.spec, hosts)
        try:
            plans = self.planned(changed)
        except MgpuError as e:
            notice(f"cannot plan the run without {', '.join(hosts)}: {str(e).splitlines()[0]}")
            return Placement(None)
        self.dropped.update({host: tuple(task for task in self.spec.tasks if task.host == host) for host in hosts})
        self.spec, self.plans = changed, with_interfaces_of(plans, self.plans)
        self.left_out.extend(host for host in hosts if host not in self.left_out)
        return Placement(self.plans)

    def with_back(self, hosts: Sequence[str]) -> tuple[ClusterSpec, list[TaskPlan]]:
        """The spec and the plans with the tasks of `hosts` (dropped before) back, after the others."""
        changed = with_tasks_back(self.spec, [task for host in hosts for task in self.dropped.get(host, ())])
        return changed, with_interfaces_of(self.planned(changed), self.plans)

    def probe_back(self, host: str) -> bool:
        """Whether a host the run went on without answers a fresh login and passes the host check
        again (its program, its Python, its ports): run beside the tasks, it tests no connection
        between them (their ports are in use); the restart that takes it back does."""
        try:
            plans = [plan for plan in self.with_back([host])[1] if plan.host == host]
        except MgpuError:
            return False
        if not plans or not all(self.login_ok(plan) is not False for plan in plans[:1]):
            return False
        if not self.options.check_hosts or all(plan.local for plan in plans):
            return True
        try:
            reports, _, _ = check_hosts_and_reach(plans, (), self.ssh, local_tensorflow_version())
        except (MgpuError, OSError, EOFError):
            return False
        return all(report.ok for report in reports)

    def grow(self, hosts: Sequence[str], notice: Callable[[str], None]) -> Placement:
        """The plans with the tasks of `hosts` back (hosts dropped before that passed their probe),
        made ready by `prepare` as a spare is (the checks and the reachability test with every task)."""
        try:
            changed, plans = self.with_back(hosts)
        except MgpuError as e:
            notice(f"cannot plan the run with {', '.join(hosts)} back: {str(e).splitlines()[0]}")
            return Placement(None)
        prepared = self.prepare(plans, hosts, notice)
        if not prepared.ok:
            return Placement(None, gone=prepared.gone)
        self.spec, self.plans = changed, list(prepared.plans)
        for host in hosts:
            self.dropped.pop(host, None)
        return Placement(self.plans)

    def planned(self, spec: ClusterSpec) -> list[TaskPlan]:
        """The plans made again from `spec`, as the command line made them."""
        return list(self.options.replan(spec))

    def relaunch(self, hosts: Sequence[str]) -> str | None:
        return relaunch_command(self.options.argv, hosts)

    def unhealthy(self, plans: Sequence[TaskPlan], left_out: Sequence[str]) -> dict[str, str]:
        if not self.options.health_check:
            return {}
        from launcher.preflight.health import unhealthy_hosts

        return unhealthy_hosts([plan for plan in plans if plan.host not in left_out], self.options.health_check,
                               self.ssh, after_attempt=True, timeout=self.options.health_check_timeout)

    def remember_left_out(self, why: dict[str, str], notice: Callable[[str], None]) -> None:
        """Into this user's quarantine (--quarantine: for so long; 0: not at all)."""
        if self.options.quarantine:
            remember(why, self.options.supervise.run_id, self.options.quarantine, notice)

    # -- backends ----------------------------------------------------------------------

    def open_ssh(self):
        """The run's SSH backend, made once (stages.open_ssh: where the fleet has SSH hosts)."""
        raise NotImplementedError

    def backend_for(self, plan: TaskPlan) -> Backend:
        """The backend that runs `plan` (the --setup's, as the task's own)."""
        raise NotImplementedError

    def backend(self) -> Backend:
        """The backend that runs the plans: whoever calls it closes it."""
        raise NotImplementedError

    def close(self) -> None:
        """What the fleet holds, when the launch ends before its run begins."""
        if self.run_dir is not None:
            self.run_dir.close()
        if self.ssh is not None:
            self.ssh.close()


class MachineFleet(Fleet):
    """A run on this machine and SSH hosts: spares are reached over SSH, on the run's connections."""

    def __init__(self, plans: Sequence[TaskPlan], options: LaunchOptions):
        super().__init__(plans, options)
        self.local = LocalBackend() if any(plan.local for plan in plans) else None

    def open_ssh(self):
        if self.ssh is None:
            self.ssh = make_ssh_backend(self.options.ssh, self.options.supervise.grace_period)
        return self.ssh

    @property
    def spares(self) -> tuple[str, ...]:
        return super().spares if self.ssh is not None else ()

    def backend_for(self, plan: TaskPlan) -> Backend:
        return self.local if plan.local else self.ssh

    def backend(self) -> Backend:
        return Routed([b for b in (self.local, self.ssh) if b is not None], self.backend_for)

    def login_ok(self, plan: TaskPlan) -> bool | None:
        if plan.local or self.ssh is None:
            return None
        try:  # a connection that was lost is not reused: this is a fresh login
            code, _, _ = self.ssh.run(plan, "true", self.ssh.options.connect_timeout)
        except (MgpuError, OSError, EOFError):
            return False
        return code == 0

    def unreachable(self, plans: Sequence[TaskPlan]) -> tuple[str, str] | None:
        if self.ssh is None:
            return None
        found = probe_reachability(plans, self.ssh)
        return found.cut[0] if found.cut else None


class SlurmFleet(Fleet):
    """A run in a Slurm allocation: a node left out gives its tasks to a spare node (one that no
    task uses); the plans are made again, ranked in the allocation's node order, and the next step
    excludes the node. Slurm checks its nodes itself: no login or reachability probe here; in a
    login's place, the node's state as Slurm's controller says it (slurm_node.py)."""

    stages = SLURM_STAGES
    question = causes.NODE_STATE

    def __init__(self, plans: Sequence[TaskPlan], options: LaunchOptions, nodes: Sequence[str]):
        super().__init__(plans, options)
        self.nodes = tuple(nodes)

    def planned(self, spec: ClusterSpec) -> list[TaskPlan]:
        return in_step_order(self.options.replan(spec), self.nodes)

    def relaunch(self, hosts: Sequence[str]) -> str | None:
        command = relaunch_command(self.options.argv, hosts)
        named, listed = ", ".join(hosts), ",".join(hosts)
        return f"{command}  (in an allocation without {named}: sbatch or salloc --exclude={listed})" if command else None

    def login_ok(self, plan: TaskPlan) -> bool | None:
        return ask_node_up(plan.host)

    def probe_back(self, host: str) -> bool:
        """Never: mgpu has no login or check of a node (Slurm's own), so a node left out stays out."""
        return False

    def backend(self) -> Backend:
        return SlurmBackend(self.plans, allocation_nodes=self.nodes)
