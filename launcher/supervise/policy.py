"""The supervisor's rules, apart from its loop: what to do next, given what happened and when.

The policy is fed events, each batch with the time it was seen (seconds on a monotonic clock),
and answers with decisions. It never reads the clock, sleeps or touches a process, so every rule
is tested with a clock the test moves by hand; the supervisor turns what the tasks and the
backend show into events, carries the decisions out and keeps the record.

The rules of one attempt:
- Fail fast: the first training task (chief or worker) to end non-zero or by a signal stops the
  attempt (`Stop(FAILED)`); of failures seen at once, a signal's before an exit code's (its peers'
  errors follow from it).
- Sidecars (the evaluator) are not part of the cluster: a sidecar that fails is a notice and
  `FailureIgnored`; once training is done, the attempt waits for them to end by themselves. Without
  training tasks, nothing is a sidecar.
- Servers (the workers and parameter servers of ParameterServerStrategy, which serve until
  stopped): the attempt's outcome is the other tasks'. Once those have ended (the chief, its
  coordinator, with 0), the attempt succeeds and the servers still running are stopped; a server
  that fails before then fails the attempt like any training task.
- Readiness: a task is ready by its sign (the ready line, or having joined the cluster, which the
  supervisor probes when asked), or by ending (a training task that ended 0 had joined; a sidecar
  that ended cannot get ready any more). Every training task must be ready by the start deadline.
- Stalls: once every task is ready, no output and no CPU use from any running training task for
  the stall timeout is a stall (0: no stall watchdog). The clock is stall.StallClock.
- A stop signal received stops the attempt (`Stop(INTERRUPTED)`), before anything else is looked at.

Between attempts, from the attempt's cause (causes.py) and the progress its tasks reported:
- The exit code of the task charged may have a rule (exit_rules.py, --exit-codes): `fail` stops the
  run, `leave-out-host` leaves its host out, `restart` is never given up as a repeated error.
- A preempted attempt (exit code 42's default rule, restart-free, or SIGTERM from outside) restarts
  the whole cluster within the preemption budget, without using up max_restarts.
- A host charged with host-lost or network is left out for the rest of the run (`Restart.leave_out`:
  the supervisor gives its tasks to a spare, or stops); so is a host charged with the same killed,
  stalled or start-timeout failure in two attempts in a row. Every other host of the attempt that
  was judged lost too (host-lost or network) is left out in the same step (`Restart.leave_out_too`),
  so that no spare is checked beside a peer that is gone; each takes the next spare
  (resize.py); without one for each the run stops (`GiveUp.left_out`), or with min_hosts drops them (`Restart.dropped`).
  The fleet is seen as data (hosts.FleetView): only a host that runs tasks is left out, and this
  machine never is (the launcher runs on it).
- Restarts must make progress: an attempt that fails with the same program error as the attempt
  before it, having reported no step beyond that attempt's, ends the run whatever max_restarts
  says (`GiveUp.reason` names the error).
- Any other failure, stall or start timeout restarts the cluster within max_restarts; an
  interrupted run never restarts.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Iterable, Sequence, Union

from launcher import protocol
from launcher.exit_codes import DEFAULTS as DEFAULT_EXIT_CODES, ExitCodes
from launcher.supervise import causes, exit_rules, status
from launcher.supervise.hosts import FleetView, place_on_spares  # noqa: F401 - the fleet's, beside the policy's
from launcher.supervise.in_place import InPlaceRestarts, RestartTask
from launcher.supervise.events import (  # noqa: F401 - what the policy is fed, named with it
    CpuSeen, Event, JoinSeen, OutputSeen, ReadyLineSeen, SignalReceived, TaskEnded)
from launcher.supervise.resize import place
from launcher.supervise.stall import StallClock
from launcher.supervise.status import describe_exit

# How often the supervisor is asked to probe whether the tasks that are ready once they join have
# joined: each probe lists the sockets of their processes.
JOIN_PROBE_INTERVAL = 0.25


# -- what the policy knows of a task -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskRole:
    name: str
    sidecar: bool = False  # its failure does not stop training
    ready_when_started: bool = False  # nothing to wait for, or no way to tell: counts as ready at once
    ready_by_joining: bool = False  # ready once a probe finds it joined (no ready line, a port)
    serves: bool = False  # serves until stopped: done once the tasks that do not serve have ended


@dataclasses.dataclass(frozen=True)
class Rules:
    start_timeout: float
    stall_timeout: float  # 0: no stall watchdog
    max_restarts: int = 0
    max_preemption_restarts: int = 0
    worker_restarts: int = 0  # parameter-server workers restarted in place (in_place.py)
    min_hosts: int = 0  # 0: a host left out without a spare stops the run (resize.py)
    exit_codes: ExitCodes = DEFAULT_EXIT_CODES  # the rules in force, which a task's end is said with


# -- events (events.py) -----------------------------------------------------------------------

# -- decisions ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Notice:
    text: str


@dataclasses.dataclass(frozen=True)
class Ready:
    """Record the task as ready (not said of a sidecar that merely ended)."""
    name: str


@dataclasses.dataclass(frozen=True)
class FailureIgnored:
    name: str


@dataclasses.dataclass(frozen=True)
class Watch:
    """Keep watching; look again no later than `until`, and then also do what is asked."""
    until: float
    probe_joins: tuple[str, ...] = ()  # probe whether these tasks have joined
    sample_cpu: tuple[str, ...] = ()  # read these tasks' CPU seconds


@dataclasses.dataclass(frozen=True)
class Stop:
    """End the attempt with this status (status.py)."""
    status: str
    failed: str | None = None  # the first training task that failed
    returncode: int | None = None  # the failed task's
    missing: tuple[str, ...] = ()  # the training tasks not ready by the start deadline
    signum: int = 0
    idle_for: float = 0.0  # a stall: seconds without activity (stall.py)


@dataclasses.dataclass(frozen=True)
class Restart:
    notice: str
    leave_out: str | None = None  # a host left out for the rest of the run: its tasks go to a spare
    leave_out_too: tuple[str, ...] = ()  # the other hosts of the attempt judged lost: left out with it
    dropped: tuple[str, ...] = ()  # of those, the hosts with no spare left: the run goes on without them

    @property
    def left_out(self) -> tuple[str, ...]:
        """Every host left out by this restart, the one charged first."""
        return ((self.leave_out,) if self.leave_out else ()) + self.leave_out_too


@dataclasses.dataclass(frozen=True)
class GiveUp:
    reason: str = ""  # why the run stops before its restarts are spent (the repeated error, no spare left)
    left_out: tuple[str, ...] = ()  # hosts left out with no spare to take their tasks: the run stops naming them
    fewer: str = ""  # why the run cannot go on without them: too few hosts would be left (--min-hosts)


Decision = Union[Notice, Ready, FailureIgnored, RestartTask, Watch, Stop]


# -- the policy --------------------------------------------------------------------------------

def _again(signum: int) -> str:
    # A second SIGTERM (another `mgpu stop`) waits for the stop under way: only SIGINT kills now.
    return "Ctrl-C again" if signum == signal.SIGINT else "SIGINT or `mgpu stop --now`"


class Policy:
    """The rules of a whole run: one `begin_attempt` per attempt, `on` for what happened in it,
    `after` once it has stopped."""

    def __init__(self, rules: Rules, grace_period: float = 0.0):
        self.rules = rules
        self.grace_period = grace_period  # only said in the notice of a stop signal
        self.restarts = 0
        self.preemptions = 0
        self._previous: tuple[causes.Cause, int | None] | None = None  # the last failed attempt's
        self._roles: dict[str, TaskRole] = {}
        self.in_place = InPlaceRestarts(rules.worker_restarts)

    # -- one attempt -----------------------------------------------------------------------

    def begin_attempt(self, roles: Sequence[TaskRole], now: float) -> list[Decision]:
        """The attempt's tasks have all been started at `now`."""
        self._roles = {role.name: role for role in roles}
        self._started = now
        self._deadline = now + self.rules.start_timeout
        self._returncodes: dict[str, int] = {}
        self._ready: set[str] = set()
        self._ready_by_ending: set[str] = set()
        self._all_ready = False
        self._next_probe = now
        self._stall: StallClock | None = None
        self._next_cpu_sample = now
        self._stopped: Stop | None = None
        decisions: list[Decision] = []
        for role in roles:
            if role.ready_when_started:
                self._ready.add(role.name)
                decisions.append(Ready(role.name))
        return decisions + self.on((), now)

    def on(self, events: Iterable[Event], now: float) -> list[Decision]:
        """What was seen at `now`; the last decision is a Watch or a Stop."""
        if self._stopped is not None:
            return [self._stopped]
        decisions: list[Decision] = []
        events = list(events)
        received = next((e for e in events if isinstance(e, SignalReceived)), None)
        if received is not None:
            return self._stop(decisions + [Notice(
                f"received {status.signal_name(received.signum)}; stopping all tasks: waiting up to "
                f"{self.grace_period:g} s for them to exit ({_again(received.signum)} to kill now)")],
                Stop(status.INTERRUPTED, signum=received.signum))

        failed: TaskEnded | None = None
        for event in events:
            if isinstance(event, TaskEnded) and event.name not in self._returncodes:
                self._returncodes[event.name] = event.returncode
                if event.returncode == 0:
                    continue
                if self._roles[event.name].sidecar:
                    decisions.append(Notice(f"{event.name} {describe_exit(event.returncode, self.rules.exit_codes)}; "
                                            f"training goes on without it"))
                    decisions.append(FailureIgnored(event.name))
                elif failed is None or event.returncode < 0 <= failed.returncode:
                    failed = event
        if failed is not None and (again := self.in_place.restart(failed.name, failed.returncode,
                                                                  self._roles[failed.name].serves)):
            del self._returncodes[failed.name]  # running again: the attempt goes on
            decisions += [Notice(again[0]), again[1]]
        elif failed is not None:
            return self._stop(decisions + [Notice(f"{failed.name} {describe_exit(failed.returncode, self.rules.exit_codes)}; stopping all tasks")],
                              Stop(status.FAILED, failed=failed.name, returncode=failed.returncode))

        signs = {e.name for e in events if isinstance(e, (ReadyLineSeen, JoinSeen))}
        if all(self._ended(role) for role in self._roles.values()):
            decisions += self._mark_ready(signs)  # a task that ended before any sign is ready too
            return self._stop(decisions, Stop(status.SUCCEEDED))
        serving = [name for name, role in self._roles.items() if role.serves and name not in self._returncodes]
        if serving and all(self._ended(role) for role in self._roles.values() if not role.serves):
            decisions += self._mark_ready(signs | set(serving))  # a server that was still there served
            done = ", ".join(name for name, role in self._roles.items() if not role.serves and not role.sidecar)
            return self._stop(decisions + [Notice(f"{done} ended; stopping the servers ({', '.join(serving)}), "
                                                  f"which serve until stopped")], Stop(status.SUCCEEDED))

        if not self._all_ready:
            decisions += self._mark_ready(signs)
            self._all_ready = len(self._ready) == len(self._roles)
            if self._all_ready and not self._ready_by_ending:
                decisions.append(Notice(f"all {len(self._roles)} tasks ready after {now - self._started:.1f} s"))
            missing = tuple(name for name, role in self._roles.items()
                            if name not in self._ready and not role.sidecar)
            if missing and now > self._deadline:
                names = ", ".join(missing)
                return self._stop(decisions + [Notice(
                    f"not ready after {self.rules.start_timeout:g} s: {names}; stopping all tasks")],
                    Stop(status.START_TIMEOUT, missing=missing))
            if not self._all_ready:
                return decisions + [self._watch_start(now)]

        return decisions + self._watch_stall(events, now)

    def none_seen_joining(self) -> bool:
        """Whether every training task that could be seen joining its cluster ended 0 before it was."""
        watched = [name for name, role in self._roles.items() if not role.sidecar and not role.ready_when_started]
        return bool(watched) and all(name in self._ready_by_ending for name in watched)

    def _ended(self, role: TaskRole) -> bool:
        """Done, as far as the attempt's success goes: a training task ended 0, a sidecar ended."""
        code = self._returncodes.get(role.name)
        return code is not None if role.sidecar else code == 0

    def _mark_ready(self, signs: set[str]) -> list[Decision]:
        decisions: list[Decision] = []
        for name, role in self._roles.items():
            if name in self._ready:
                continue
            if name in signs or self._ended(role):
                self._ready.add(name)
                if name not in signs:
                    self._ready_by_ending.add(name)
                if not (role.sidecar and name in self._ready_by_ending):
                    decisions.append(Ready(name))
        return decisions

    def _watch_start(self, now: float) -> Watch:
        probe: tuple[str, ...] = ()
        if now >= self._next_probe:
            self._next_probe = now + JOIN_PROBE_INTERVAL
            probe = tuple(name for name, role in self._roles.items()
                          if role.ready_by_joining and name not in self._ready)
        return Watch(until=min(self._next_probe, self._deadline), probe_joins=probe)

    def _running_training(self) -> list[str]:
        return [name for name, role in self._roles.items() if not role.sidecar and name not in self._returncodes]

    def _watch_stall(self, events: list[Event], now: float) -> list[Decision]:
        if not self.rules.stall_timeout:
            return [Watch(until=float("inf"))]
        if self._stall is None:
            self._stall = StallClock(self.rules.stall_timeout, now)
        training = set(self._running_training())
        if not training:  # training is over: a sidecar still at work is not a stall
            return [Watch(until=float("inf"))]
        for event in events:
            if isinstance(event, OutputSeen) and event.name in training:
                self._stall.output_seen(event.at)
            elif isinstance(event, CpuSeen) and event.name in training:
                self._stall.cpu_sample(event.name, event.cpu_seconds, now)
        if self._stall.stalled(now):
            idle_for = self._stall.idle_for(now)
            # Say only what was seen: CPU use is not measured for tasks in a Slurm step.
            unmeasured = sorted(name for name in training if not self._stall.measured(name))
            if not unmeasured:
                seen = "no output, no CPU use"
            elif len(unmeasured) == len(training):
                seen = "no output; CPU use not measured"
            else:
                seen = f"no output, no CPU use; CPU use not measured for {', '.join(unmeasured)}"
            return self._stop([Notice(
                f"no progress from any training task for {idle_for:.0f} s ({seen}); "
                f"collecting every task's stacks (py-spy; SIGABRT where it cannot attach), then stopping all tasks")],
                Stop(status.STALLED, idle_for=idle_for))
        sample: tuple[str, ...] = ()
        if now >= self._next_cpu_sample:
            self._next_cpu_sample = now + self._stall.cpu_sample_interval
            sample = tuple(sorted(training))
        stall_at = self._stall.activity_at + self._stall.timeout
        return [Watch(until=min(self._next_cpu_sample, stall_at), sample_cpu=sample)]

    def _stop(self, decisions: list[Decision], stop: Stop) -> list[Decision]:
        self._stopped = stop
        return decisions + [stop]

    # -- between attempts ------------------------------------------------------------------

    def after(self, stop: Stop, cause: causes.Cause | None = None, progress: int | None = None,
              others: Sequence[causes.Cause] = (), fleet: FleetView | None = None) -> Restart | GiveUp:
        """The attempt stopped so, for `cause` (causes.classify), its tasks having reported steps up
        to `progress` (None: none reported): restart the cluster (leaving hosts out, each replaced by
        a spare), stop (hosts to leave out and too few spares), or give up.
        `others`: the causes of the attempt's other hosts that were judged too (a lost connection,
        tasks that gave no exit status): those lost are left out with the host charged. `fleet`:
        the run's hosts (None: every host may be left out, spares are not counted here)."""
        if stop.status in (status.SUCCEEDED, status.INTERRUPTED):
            return GiveUp()
        if (fails := exit_rules.stop_reason(cause)) is not None:  # the program's exit code says: no restart
            return GiveUp(fails)
        previous, self._previous = self._previous, (cause, progress) if cause is not None else None
        may_leave_out = fleet.may_leave_out if fleet is not None else lambda host: True
        lost_too = tuple(dict.fromkeys(other.host for other in others if other.host is not None
                                       and other.kind in causes.HOST_CAUSES and may_leave_out(other.host)))
        preempted = exit_rules.restarts_free(cause, stop.returncode)  # preempted, or the exit code says so
        if preempted and self.preemptions < self.rules.max_preemption_restarts:
            self.preemptions += 1
            without = f" without {', '.join(lost_too)}" if lost_too else ""
            return self._placed(Restart(f"restarting all tasks{without} after {exit_rules.free_restart_reason(cause)} "
                                        f"({self.preemptions} of at most "
                                        f"{self.rules.max_preemption_restarts})", leave_out_too=lost_too), fleet)
        leave_out = None
        if cause is not None and not preempted:
            repeated = previous is not None and cause.same_failure(previous[0])
            progressed = progress is not None and (previous is None or previous[1] is None or progress > previous[1])
            if cause.kind == causes.PROGRAM_ERROR and repeated and not progressed and not exit_rules.asks_restart(cause):
                return GiveUp(f"the same error twice in a row without progress: {cause.detail}")
            if cause.host is not None and may_leave_out(cause.host) and (
                    cause.kind in causes.HOST_CAUSES or exit_rules.leaves_out_host(cause) or (
                    repeated and cause.kind in (causes.KILLED, causes.STALLED, causes.START_TIMEOUT))):
                leave_out = cause.host
        if self.restarts < self.rules.max_restarts:
            self.restarts += 1
            leave_out_too = tuple(host for host in lost_too if host != leave_out)
            left_out = ((leave_out,) if leave_out else ()) + leave_out_too
            without = f" without {', '.join(left_out)}" if left_out else ""
            return self._placed(Restart(f"restarting all tasks{without} (restart {self.restarts} of "
                                        f"{self.rules.max_restarts})", leave_out=leave_out, leave_out_too=leave_out_too), fleet)
        return GiveUp()

    def _placed(self, restart: Restart, fleet: FleetView | None) -> Restart | GiveUp:
        """The restart, if its hosts left out have a place (resize.place); else the run stops naming them."""
        placed = place(restart.left_out, fleet, self.rules.min_hosts)
        return (dataclasses.replace(restart, dropped=placed.dropped) if placed.goes_on
                else GiveUp(placed.reason, left_out=restart.left_out, fewer=placed.fewer))
