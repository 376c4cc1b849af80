"""Supervision of a run: the loop over its attempts, after torch's SimpleElasticAgent._invoke_run.

What to do is the pure policy's (policy.py: fail fast, sidecars, servers, readiness and the start
deadline, stalls, restarts that must make progress, hosts left out). An attempt's processes are an
Attempt (attempt.py: start, poll, collect, stop, close); what it collects on a stall or a start
timeout is evidence.py's; why it failed, charged to a task and its host, is blame.py's; what it
cost is costs.py's; the run's hosts are reached through HostActions (hosts.py). This module feeds
the policy what the attempt shows, carries its decisions out and keeps the record (run.json), the
pace rule's samples, the terminal and the closing line. SIGINT or SIGTERM stop every task (a
second one skips the grace period) and raise Interrupted; SIGHUP moves the console to console.log
and the run goes on. The reaper (reaper.py) guards the record and this machine's processes if the
launcher dies; a run id must therefore not be in use by live processes when a run starts.
"""

from __future__ import annotations

import secrets
import sys
import time
from typing import Callable, Sequence, TextIO

from launcher.errors import Interrupted, MgpuError, TaskFailed, UsageError
from launcher.plan.planner import TaskPlan
from launcher.backends.base import Backend
from launcher.supervise import (causes, evidence, exit_rules, flight_recorder, health, pace, policy, runrecord, sizes,
                               stacks_request)
from launcher.supervise.attempt import DRAIN_TIMEOUT, POLL_INTERVAL, Attempt, TaskKinds  # noqa: F401 - DRAIN_TIMEOUT, told here too
from launcher.supervise.blame import charge
from launcher.supervise.costs import Cost, RunCosts, resized_story
from launcher.supervise.hosts import HostActions, Placement, Seen, judge_others, left_out_head
from launcher.supervise.notify import Notifier
from launcher.supervise.options import SuperviseOptions
from launcher.supervise.output import RunOutput
from launcher.supervise.reaper import Reaper
from launcher.supervise.rundir import RunDir, make_run_dir
from launcher.supervise.samples import RunSamples
from launcher.supervise.signals import Signals
from launcher.supervise.status import FAILED, INTERRUPTED, RESIZED, STALLED, START_TIMEOUT, SUCCEEDED
from launcher.supervise.summary import closing_line, failure_summary, restart_story, stall_summary, start_timeout_summary
from launcher.supervise.take_back import TakeBack
from launcher.supervise.terminal import Terminal

LOG_FLUSH_INTERVAL = 0.5


def supervise(
    plans: Sequence[TaskPlan],
    backend: Backend,
    options: SuperviseOptions,
    console: TextIO = sys.stdout,
    clock: Callable[[], float] = time.monotonic,
    detach: Callable[[], None] | None = None,
    run_dir: RunDir | None = None,
    hosts: HostActions = HostActions(),
) -> None:
    """Run the tasks until all exit 0 (return), one fails (TaskFailed) or a signal arrives (Interrupted).

    Run files (run.json, <type>-<index>.log, reaper.log) go to options.log_dir / options.run_id.
    `backend` runs every task (Routed, for a run that mixes kinds of tasks); it stays open:
    whoever made it closes it. `clock` is the policy's (its deadlines and the stall clock): a test
    may move it on an event. `detach`, for a detached launch, is called once the run has begun (its run
    dir made, its ports free), after the console has moved to console.log: it lets the terminal go.
    `run_dir`: the run's folder where the launch made it already (for what ran before the tasks:
    --setup's logs); supervise closes it.
    """
    if not plans:
        if run_dir is not None:
            run_dir.close()
        raise UsageError("no tasks to run")
    if run_dir is None:
        run_dir = make_run_dir(options)
    try:
        _Supervisor(plans, backend, options, console, run_dir, clock, detach, hosts).run()
    finally:
        run_dir.close()


class _RunFailed(Exception):
    """Carries the final status (failed or start-timeout) along with the error to raise."""

    def __init__(self, status: str, error: TaskFailed):
        super().__init__(status)
        self.status = status
        self.error = error


class _Supervisor:
    def __init__(self, plans: Sequence[TaskPlan], backend: Backend, options: SuperviseOptions, console: TextIO,
                 run_dir: RunDir, clock: Callable[[], float] = time.monotonic,
                 detach: Callable[[], None] | None = None, hosts: HostActions = HostActions()):
        self.clock = clock
        self.detach = detach
        self.hosts = hosts
        self.costs = RunCosts()
        self.left_out: list[str] = []  # every host left out so far: no relaunch command names one
        self.plans = list(plans)
        self.first_hosts = sizes.planned_hosts(self.plans)
        self.backend = backend
        self.options = options
        self.run_dir = run_dir
        self.signals = Signals()
        self.kinds = TaskKinds.of(self.plans)
        # Tags this launch's processes beside the run id (protocol.ENV_LAUNCH_ID).
        self.launch_id = secrets.token_hex(8)
        self.output = RunOutput(run_dir, console, options.timestamps, options.show, options.show_tf_logs)
        self.record = runrecord.RunRecord(run_dir, options.run_id, self.plans, options.recorded(),
                                          options.show_secrets, report=self.output.notice)
        self.terminal = Terminal(run_dir, self.output, self.signals, options.run_id)
        self.stacks_requests = stacks_request.Requests(run_dir, self.output.notice)  # of `mgpu stacks`
        self.attempt: Attempt | None = None  # the last one begun
        self._named_slowest: set[str] = set()  # tasks named as the one the others wait for: once a run
        self.policy = policy.Policy(options.rules(), grace_period=options.grace_period)
        self.notifier = Notifier(options.run_id, options.notify, options.notify_url, report=self.output.notice)
        self.samples = RunSamples(run_dir, options.tensorboard, self.costs.started, self.output.notice)
        self._busy: dict[str, float] = {}  # the training tasks' latest busy shares, for the samples
        self.take_back = TakeBack(hosts, options.rejoin_interval if options.min_hosts else 0, self.output.notice, self.notifier)

    # -- the whole run ---------------------------------------------------------

    def run(self) -> None:
        reaper: Reaper | None = None
        final = (FAILED, None, 1)
        started = time.monotonic()
        try:
            with self.signals:
                # The record's guard, for every run: if the launcher dies, run.json still says so.
                reaper = Reaper.start(self.options.run_id, self.options.grace_period, self.run_dir, self.launch_id)
                self.backend.check_ports(self.plans)
                if self.detach is not None:
                    self.terminal.move_console()
                    self.detach()
                self.notifier.run_started(len(self.plans), list(dict.fromkeys(p.host for p in self.plans)), bool(self.detach))
                final = self._attempts()
                self._warn_if_none_met()
                tasks = self.attempt.tasks
                # A server stopped once the chief was done did what it was for.
                succeeded = sum(t.returncode == 0 or t.plan.type in self.kinds.servers for t in tasks)
                wall = time.monotonic() - started
                stories = [restart_story(c.cause, c.at, c.took or resized_story(c, self.costs.costs, self.take_back.growths)) for c in self.costs.costs]
                self.output.notice(closing_line(len(tasks), succeeded, wall, self.attempt.number, self.run_dir.path,
                                                stories, costs=self.costs.totals(), in_place=self.policy.in_place.used))
        except Interrupted as e:
            final = (INTERRUPTED, str(e), e.exit_code)
            raise
        except _RunFailed as e:
            final = (e.status, str(e.error), e.error.exit_code)
            raise e.error from None
        except MgpuError as e:
            final = (FAILED, str(e), e.exit_code)
            raise
        finally:
            try:
                self.record.run_costs(totals := self.costs.totals())
                self.record.finish(*final)
                self._sample(totals)  # the last sample: the run's final figures
                self.samples.close()
                if said := self.notifier.finish(*final, totals):  # the notices failed or dropped, if any
                    self.output.notice(said)
                    self.record.run_warning(said)
            finally:
                try:
                    if reaper is not None:  # every task is gone and the record final: nothing left to guard
                        reaper.dismiss()
                    self.terminal.check_hang_up()  # a hang-up at the very end: the closing lines still go to console.log
                finally:
                    self.output.close()  # as long as the console takes: mgpu's own lines are never dropped

    def _attempts(self) -> tuple[str, None, int]:
        attempt = 0
        while True:
            self.output.best_step = self.costs.best_step
            stop = self._attempt(attempt)
            progress = self.attempt.progress()
            lost = self.costs.attempt_ended(self.attempt, stop, self.record)
            if stop.status == SUCCEEDED:
                return SUCCEEDED, None, 0
            if self.signals.received:
                raise Interrupted(self.signals.received[0])
            if stop.status == RESIZED:  # to take back hosts right after a checkpoint: no failure, no restart used
                self._take_back()
                attempt += 1
                continue
            cause = exit_rules.restate(charge(stop, self.attempt, self.hosts, self.plans), self.options.exit_codes)
            # Hosts lost together are judged together: every other host that lost its connection or
            # left its tasks without an exit status.
            others = [] if stop.status == INTERRUPTED else judge_others(
                stop.status, [Seen(t.plan, t.proc.lost(), t.returncode is not None) for t in self.attempt.tasks],
                cause.host if cause is not None else None, self.hosts)
            if cause is not None:
                self.record.attempt_cause({**cause.to_dict(), **({"also": [c.to_dict() for c in others]} if others else {})})
            for judged in ([cause] if cause is not None else []) + others:
                self.output.notice(f"attempt {attempt + 1} failed: {judged.kind}"
                                   f"{f' ({judged.task} on {judged.host})' if judged.task else ''}: {judged.detail}")
                self.notifier.attempt_failed(attempt + 1, judged)
            after = self.policy.after(stop, cause, progress, others, self.hosts.view(self.plans))
            found: list[causes.Cause] = []
            if isinstance(after, policy.Restart):  # the health check, on the hosts that stay
                after, found = health.after_checks(after, self.hosts.unhealthy(self.plans, after.left_out),
                                                   self.hosts.view(self.plans), self.options.min_hosts)
                others = others + found
            self.costs.progressed(progress)
            if (isinstance(after, policy.Restart) or after.left_out) and (cause or others):
                self.costs.costs.append(Cost(cause or others[0], time.time(), lost,
                                             restarted=isinstance(after, policy.Restart)))
            if after.left_out:  # to spares (a Restart), or the run stops naming them (a GiveUp)
                # A host that failed its health check is left out for that, whatever its task did.
                self._leave_out(list(after.left_out), stop, found + ([cause] if cause is not None else []) + [c for c in others if c not in found], attempt,
                                to_spares=isinstance(after, policy.Restart), after=after)
            if isinstance(after, policy.GiveUp):
                summary = self._summary(stop, attempt)
                if cause is not None and cause.kind in (causes.KILLED, *causes.HOST_CAUSES):  # else the head says it
                    summary = f"{summary}\ncause: {cause.kind}: {cause.detail}"
                if after.reason:
                    summary = f"{summary}\nstopped restarting: {after.reason}"
                raise _RunFailed(stop.status, TaskFailed(summary))
            self.output.notice(after.notice)
            if cause is not None:
                self.samples.restart(attempt + 1, time.time(), cause.to_dict())
            if self.take_back.rule.back:  # hosts back join at any restart
                self._take_back()
            attempt += 1

    def _warn_if_none_met(self) -> None:
        """A run whose tasks all ended 0 before any was seen joining its cluster, and that reported
        no progress, succeeded as far as exit codes go; it may well have trained nothing."""
        if self.policy.none_seen_joining() and self.attempt.progress() is None:
            text = ("no task was seen joining its cluster or reporting progress before it ended; "
                    "check in its logs that it trained")
            self.output.notice(f"warning: {text}")
            self.record.run_warning(text)

    # -- one attempt -------------------------------------------------------------

    def _attempt(self, number: int) -> policy.Stop:
        """Start attempt `number`, watch it until the policy stops it, collect the evidence, stop it."""
        self.record.attempt_started(number, self.costs.begin())  # the record's times are its costs'
        self.attempt = attempt = Attempt(
            number, self.plans, self.backend, run_id=self.options.run_id, launch_id=self.launch_id, kinds=self.kinds,
            output=self.output, record=self.record, run_dir=self.run_dir, signals=self.signals,
            on_each_wait=self.terminal.check_hang_up)
        stop = policy.Stop(FAILED)
        try:
            if not attempt.start():
                stop = policy.Stop(INTERRUPTED, signum=self.signals.received[0])
                return stop
            stop = self._watch(attempt)
            attempt.collect(evidence.while_alive(stop))
            return stop
        finally:
            attempt.stop(self.options.grace_period)
            attempt.close()
            attempt.collect(evidence.after_stop(stop))
            self.record.attempt_ended(stop.status, self.costs.end())

    def _watch(self, attempt: Attempt) -> policy.Stop:
        """The one loop of an attempt: report what happened to the policy, do what it decides."""
        tasks = attempt.tasks
        next_flush = time.monotonic() + LOG_FLUSH_INTERVAL
        next_progress = time.monotonic()
        # Real time, not self.clock: shares are CPU seconds over wall seconds.
        compared = (pace.compared([(t.plan.name, t.plan.type, t.plan.host) for t in tasks], self.kinds.sidecars,
                                  self.kinds.servers) if self.options.slow_window else {})
        paced = pace.Training(compared, window=self.options.slow_window or pace.WINDOW, named=self._named_slowest)
        next_pace = time.monotonic()
        decisions = self.policy.begin_attempt(attempt.roles(), self.clock())
        self.take_back.begin_attempt()
        while True:
            watch = self._carry_out(decisions, attempt)
            if isinstance(watch, policy.Stop):
                return watch
            self.terminal.check_hang_up()
            if self.take_back.now(tasks, self.clock):  # hosts back and a checkpoint just reported
                return policy.Stop(RESIZED)
            self.stacks_requests.look(lambda task, native: evidence.live(attempt, task, native))
            if time.monotonic() >= next_progress:
                for task in tasks:
                    self.record.task_progress(task.plan, *task.output.progress.snapshot())
                next_progress = time.monotonic() + runrecord.PROGRESS_INTERVAL
                if self.samples.due(time.time()):
                    self._sample(self.costs.live(attempt, time.time()))
            if paced.hosts and time.monotonic() >= next_pace:
                self._pace(paced, attempt)
                next_pace = time.monotonic() + pace.SAMPLE_INTERVAL
            self.record.flush()
            if time.monotonic() > next_flush:
                for task in tasks:
                    task.output.flush()
                next_flush = time.monotonic() + LOG_FLUSH_INTERVAL
            time.sleep(max(0.0, min(POLL_INTERVAL, watch.until - self.clock())))
            now = self.clock()
            decisions = self.policy.on(attempt.poll(watch, now), now)

    def _carry_out(self, decisions: list[policy.Decision], attempt: Attempt) -> policy.Watch | policy.Stop:
        """Notices to the console, readiness and ignored failures to the record; returns the last
        decision (what to do next)."""
        by_name = attempt.by_name
        for decision in decisions:
            if isinstance(decision, policy.Notice):
                self.output.notice(decision.text)
            elif isinstance(decision, policy.Ready):
                by_name[decision.name].ready_at = time.time()
                self.record.task_ready(by_name[decision.name].plan)
            elif isinstance(decision, policy.FailureIgnored):
                self.record.task_failure_ignored(by_name[decision.name].plan)
            elif isinstance(decision, policy.RestartTask):
                attempt.restart_task(decision.name)
        last = decisions[-1]
        assert isinstance(last, (policy.Watch, policy.Stop))
        return last

    def _pace(self, paced: pace.Training, attempt: Attempt) -> None:
        """Feed what each running training task shows (ready, progress, CPU sample, time split) to the
        pace rule; name the slow task once it shows; record every task's busy share."""
        now = time.monotonic()
        for task in attempt.running():
            if task.plan.name in paced.hosts:
                usage = task.proc.usage()
                paced.see(task.plan.name, pace.Seen(
                    task.ready_at is not None, task.output.progress.step is not None,
                    None if usage is None else (usage.at, usage.runnable_seconds), task.output.time_split.total()), now)
        slowest = paced.slowest(now)
        if slowest is not None:
            self.output.notice(slowest.text())
            self.record.attempt_slowest(slowest.to_dict())
        source, shares = paced.shares(now)
        self._busy = {name: round(share, 3) for name, share in shares.items() if share is not None}
        for task in attempt.tasks:
            share = shares.get(task.plan.name)
            self.record.task_busy(task.plan, None if share is None else
                                  {"share": round(share, 3), "source": source, "window_s": paced.window})

    def _sample(self, costs: dict) -> None:
        """The run as it stands, into samples.jsonl (and TensorBoard's event files, with --tensorboard)."""
        if self.attempt is not None:
            tasks = self.attempt.tasks
            self.samples.take(time.time(), self.attempt.number, {t.plan.name: t.output.progress.step for t in tasks},
                              len({t.plan.host for t in tasks}), self._busy, costs)

    # -- hosts left out --------------------------------------------------------------

    def _leave_out(self, hosts: list[str], stop: policy.Stop, judged: list[causes.Cause], attempt: int,
                   to_spares: bool = True, after: policy.Restart | policy.GiveUp | None = None) -> None:
        """Give the tasks of every host in `hosts` to a spare of its own and plan again, or drop those
        of the hosts the restart drops (`--min-hosts`), or (no spare that passes its checks, or
        `to_spares` false) stop the run naming them and the command that relaunches without any
        host found lost."""
        before, dropped = self.plans, after.dropped if isinstance(after, policy.Restart) else ()
        placement = sizes.place(self.hosts, hosts, dropped, self.output.notice, before, self.options.min_hosts) if to_spares else Placement(None)
        dropped = placement.dropped  # with those whose spare failed its checks, when --min-hosts allows
        judged = judged + [causes.Cause(causes.NETWORK, None, host, "the spares' check could not reach it")
                           for host in placement.gone]  # found gone after the attempt: left out too
        why = {host: next((f"{c.kind}: {c.detail}" for c in judged if c.host == host), "failed")
               for host in (*hosts, *placement.gone)}
        self.left_out.extend(host for host in why if host not in self.left_out)
        self.hosts.remember_left_out(why, self.output.notice)
        for host in why if placement.plans is None else ():
            self.notifier.host_left_out(host, why[host], None)
        if placement.plans is None:
            head = left_out_head(why, [plan.name for plan in self.plans if plan.host in why],
                                 self.hosts.relaunch(tuple(self.left_out)), getattr(after, "fewer", ""))
            raise _RunFailed(stop.status, TaskFailed(f"{head}\n{self._summary(stop, attempt)}"))
        took = {host: f"{spare} took {', '.join(p.name for p in self.plans if p.host == host)}" for host, spare in placement.took}
        for host, spare in placement.took:
            self.output.notice(f"{host} left out for the rest of the run ({why[host]}); {took[host]}")
            self.notifier.host_left_out(host, why[host], spare)
        self.plans = list(placement.plans)
        resized = sizes.resized(before, self.plans, dropped, why, self.first_hosts, self.options.min_hosts,
                                self.record, self.output.notice, self.notifier)
        self.take_back.left_out(dropped, self.clock)
        if self.costs.costs:
            cost = self.costs.costs[-1]
            cost.left_out, cost.took = cost.cause.host in took or cost.cause.host in dropped, took.get(cost.cause.host)
            cost.others = tuple((c, took.get(c.host)) for c in judged if (c.host in took or c.host in dropped)
                                and c.host != cost.cause.host)
            cost.resized = resized

    def _take_back(self) -> None:
        """The hosts back (rejoin.py) join the cluster: the plans made again with their tasks."""
        self.plans, change = self.take_back.take_in(self.plans, self.first_hosts, self.record, self.clock())
        self.left_out = [host for host in self.left_out if change is None or host not in change.back]

    # -- the failure summary -------------------------------------------------------

    def _summary(self, stop: policy.Stop, number: int) -> str:
        after = f", after {number} restart{'s' if number > 1 else ''}" if number > 0 else ""
        attempt = self.attempt
        tasks = attempt.tasks
        if stop.status == STALLED:
            head = f"stall: no training task made progress for {stop.idle_for:.0f} s{after}"
            training = [attempt.view(t) for t in tasks if not t.sidecar]
            return stall_summary(head, training, self.run_dir / evidence.stacks_file_name(number),
                                 self.options.stall_timeout, attempt.stacks_asked_at, evidence.whereabouts(attempt),
                                 self.run_dir / evidence.bundle_name(number), flight_recorder.report_lines(attempt))
        if stop.status == START_TIMEOUT:
            names = ", ".join(stop.missing)
            head = f"start timeout: {names} not ready after {self.options.start_timeout:g} s{after}"
            return start_timeout_summary(head, [attempt.view(t) for t in tasks if t.plan.name in stop.missing])
        task = next(t for t in tasks if t.plan.name == stop.failed)
        peers = [attempt.view(t) for t in tasks if t is not task and not t.sidecar]
        return failure_summary(attempt.view(task), peers, after)
