"""Supervision of a run: start every task, watch them, stop them all together.

The rules below are decided by the pure policy (policy.py); this module keeps the loop that feeds it
what happened, the processes, the output and the record.

The rules:
- Fail fast: the first training task (chief or worker) to exit non-zero or die
  by a signal stops the whole cluster: TERM to every task's process tree, KILL
  after the grace period.
- Sidecars: the evaluator is not part of the cluster. When it fails, training
  goes on without it (a notice, and failure_ignored in run.json); when training
  is done, the run waits for it to finish by itself. The run's outcome is the
  training tasks'.
- Readiness: a task whose plan waits for readiness is ready once it prints
  protocol.READY_LINE on stdout; any other program once it has joined the
  cluster as its backend sees it: a process of its tree listens on its own port
  (a TensorFlow server; process 0 of JAX or PyTorch) or holds a connection to
  the coordinator's port (the first member's: the other JAX and PyTorch
  processes dial it and listen on nothing); a task without a port, or whose
  backend cannot tell, once started. Every training task must be ready within the
  start timeout, else the cluster is stopped and the report names what each
  missing task did not do.
- Restarts: after a failure the whole cluster restarts (a multi-worker strategy
  needs every worker back), up to max_restarts times. A task exiting with
  protocol.EXIT_PREEMPTED restarts the cluster without using up max_restarts,
  up to max_preemption_restarts times. Each failed attempt gets a cause
  (causes.py) charged to a task and its host, gathered here (the blame rules, the
  task's program error, a lost connection and a fresh login, the reachability test
  run again); the policy then stops a run whose restarts make no progress, and
  leaves a failing host out: HostActions gives its tasks to a spare host and plans
  again, or the run stops naming the host and the command that relaunches without it.
- Costs: per attempt, when all were ready, the progress reported and the time lost;
  in all, restarts, hosts left out, time lost and goodput (run.json, the closing line).
- Stalls: once every task is ready, a run in which no training task makes
  progress (output, or CPU use: stall.py) for the stall timeout is stalled:
  every task gets SIGABRT, on which faulthandler (PYTHONFAULTHANDLER, set for
  every task) prints each Python thread's stack into its log; the report says
  where each task was and names the tasks not waiting in the framework (the
  likely cause), and the stacks are kept in the run dir. A stall is a failure:
  max_restarts applies.
- Pace: every few seconds each running training task's readiness, progress, CPU use (the backend's
  sample) and time split (MGPU_TIME_SPLIT lines) go to the pace rule (pace.py), which, once training
  has begun, names the task a synchronous job waits for; every task's busy share goes to run.json.
- Signals: SIGINT or SIGTERM to the launcher stop every task the same way (a
  second one skips the grace period), then raise Interrupted. SIGHUP (the
  terminal closed) does not: the run goes on, its console in console.log, as a
  detached run's does from its start.
- Nothing is left behind: every stop ends with the backend's sweep for processes
  of the run (locally: those carrying the run's MGPU_RUN_ID), and the backend's
  reaper (reaper.py) does the same for this machine if the launcher dies, and records the run as
  launcher-died. Hence a run id must not be in use
  by live processes when a run starts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import secrets
import signal
import sys
import time
from typing import Callable, Sequence, TextIO

from launcher import error_file, protocol
from launcher.supervise import runrecord
from launcher.errors import Interrupted, MgpuError, TaskFailed, UsageError
from launcher.supervise.output import RunOutput, TaskOutput, log_name
from launcher.plan.planner import TaskPlan
from launcher.supervise.options import SuperviseOptions
from launcher.supervise.signals import Signals
from launcher.supervise import causes, diagnosis, pace, policy, stacks
from launcher.supervise.rundir import CONSOLE_LOG, RunDir, make_run_dir
from launcher.supervise.summary import (
    TaskView, at_fault, closing_line, restart_story, failure_summary, program_error, stall_summary, start_timeout_summary,
)
from launcher.backends.base import Attempt, Backend, TaskProcess
from launcher.supervise.reaper import Reaper
from launcher.supervise.hosts import HostActions, Seen, judge_others, left_out_head

POLL_INTERVAL = 0.05
# Tasks started at once where their backend allows it (each start is a thread waiting on a remote shell).
MAX_STARTS_AT_ONCE = 32
LOG_FLUSH_INTERVAL = 0.5
REAP_TIMEOUT = 5.0  # after KILL, how long a task may take to be reported gone
DRAIN_TIMEOUT = 5.0  # after the tasks are gone, how long their output may take to reach end of file
# After SIGABRT, how long tasks may take to write their stacks and end: ample, since a stalled job's
# tasks may share a loaded machine, and waiting ends as soon as they have.
STACKS_TIMEOUT = 30.0


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


def stacks_file_name(attempt: int) -> str:
    return f"stacks-{attempt}.txt"


@dataclasses.dataclass
class _Task:
    plan: TaskPlan
    proc: TaskProcess
    output: TaskOutput
    sidecar: bool  # its failure does not stop training
    attempt: int
    returncode: int | None = None
    ended_at: float | None = None  # when its end was seen, seconds since the epoch
    joined: bool | None = None  # known at a start timeout: whether it had joined; None: unknown
    ready_at: float | None = None  # when it was recorded ready, seconds since the epoch

    @property
    def started_by_joining(self) -> bool:
        """Ready once it joins the cluster: a program without the ready line, in the cluster."""
        return not self.plan.waits_for_ready and self.plan.port is not None


@dataclasses.dataclass
class _Cost:
    """A failed attempt that was restarted: why, when, the time it lost, the host left out."""
    cause: causes.Cause
    at: float  # seconds since the epoch
    lost: float
    left_out: bool = False
    took: str | None = None  # "h5 took worker:1": the spare that took the left-out host's tasks
    others: tuple[tuple[causes.Cause, str | None], ...] = ()  # the other hosts left out with it, and who took theirs


class _RunFailed(Exception):
    """Carries the final status (failed or start-timeout) along with the error to raise."""

    def __init__(self, status: str, error: TaskFailed):
        super().__init__(status)
        self.status = status
        self.error = error


class _Supervisor:
    def __init__(
        self,
        plans: Sequence[TaskPlan],
        backend: Backend,
        options: SuperviseOptions,
        console: TextIO,
        run_dir: RunDir,
        clock: Callable[[], float] = time.monotonic,
        detach: Callable[[], None] | None = None,
        hosts: HostActions = HostActions(),
    ):
        self.clock = clock
        self.detach = detach
        self.console_moved = False
        self.hosts = hosts
        self.best_step: int | None = None  # the highest step any attempt reported
        self.costs: list[_Cost] = []  # one per failed attempt that was restarted
        self.left_out: list[str] = []  # every host left out so far: no relaunch command names one
        self._codes_at_stop: dict[str, int | None] = {}
        self.plans = list(plans)
        self.backend = backend
        self.options = options
        self.run_dir = run_dir
        self.signals = Signals()
        # Process 0 of JAX and PyTorch: the first member of the cluster, whose port the others dial.
        self.coordinator_port = self.plans[0].coordinator_port
        # Without training tasks, nothing is a sidecar: every task counts.
        self.sidecar_types = (
            frozenset(p.type for p in self.plans) - frozenset(protocol.TRAINING_TASK_TYPES)
            if any(p.type in protocol.TRAINING_TASK_TYPES for p in self.plans)
            else frozenset()
        )
        # ParameterServerStrategy: the chief coordinates; its workers and parameter servers serve until stopped.
        self.server_types = frozenset({"worker", "ps"}) if any(p.type == "ps" for p in self.plans) else frozenset()
        recorded_options = {
            "grace_period": options.grace_period,
            "start_timeout": options.start_timeout,
            "max_restarts": options.max_restarts,
            "stall_timeout": options.stall_timeout,
            "slow_window": options.slow_window,
            "max_preemption_restarts": options.max_preemption_restarts,
            "log_dir": str(options.log_dir),
        }
        # Tags this launch's processes beside the run id (protocol.ENV_LAUNCH_ID).
        self.launch_id = secrets.token_hex(8)
        self.output = RunOutput(run_dir, console, options.timestamps, options.show, options.show_tf_logs)
        self.record = runrecord.RunRecord(run_dir, options.run_id, self.plans, recorded_options, options.show_secrets,
                                          report=self.output.notice)
        self._last_attempt: tuple[int, list[_Task]] = (0, [])
        self._stopped_at: float | None = None  # when the stall watchdog asked for the stacks
        self._named_slowest: set[str] = set()  # tasks named as the one the others wait for: once a run
        self.policy = policy.Policy(
            policy.Rules(start_timeout=options.start_timeout, stall_timeout=options.stall_timeout,
                         max_restarts=options.max_restarts, max_preemption_restarts=options.max_preemption_restarts),
            grace_period=options.grace_period)

    # -- the whole run ---------------------------------------------------------

    def run(self) -> None:
        reaper: Reaper | None = None
        final = (runrecord.FAILED, None, 1)
        started = time.monotonic()
        try:
            with self.signals:
                # The record's guard, for every run: if the launcher dies, run.json still says so.
                reaper = Reaper.start(self.options.run_id, self.options.grace_period, self.run_dir, self.launch_id)
                self.backend.check_ports(self.plans)
                if self.detach is not None:
                    self._move_console()
                    self.detach()
                final = self._attempts()
                attempt, tasks = self._last_attempt
                # A server stopped once the chief was done did what it was for.
                succeeded = sum(t.returncode == 0 or t.plan.type in self.server_types for t in tasks)
                wall = time.monotonic() - started
                stories = [restart_story(c.cause, c.at, c.took) for c in self.costs]
                lost = sum(c.lost for c in self.costs)
                self.output.notice(closing_line(len(tasks), succeeded, wall, attempt, self.run_dir.path, stories, lost))
        except Interrupted as e:
            final = (runrecord.INTERRUPTED, str(e), e.exit_code)
            raise
        except _RunFailed as e:
            final = (e.status, str(e.error), e.error.exit_code)
            raise e.error from None
        except MgpuError as e:
            final = (runrecord.FAILED, str(e), e.exit_code)
            raise
        finally:
            try:
                self.record.run_costs(self._totals(time.monotonic() - started))
                self.record.finish(*final)
            finally:
                try:
                    if reaper is not None:  # every task is gone and the record final: nothing left to guard
                        reaper.dismiss()
                    self._check_hang_up()  # a hang-up at the very end: the closing lines still go to console.log
                finally:
                    self.output.close()  # as long as the console takes: mgpu's own lines are never dropped

    def _attempts(self) -> tuple[str, None, int]:
        attempt = 0
        while True:
            started = time.time()
            stop = self._attempt(attempt)
            progress = self._progress()
            lost = self._record_cost(started, stop, progress)
            if stop.status == runrecord.SUCCEEDED:
                return runrecord.SUCCEEDED, None, 0
            if self.signals.received:
                raise Interrupted(self.signals.received[0])
            cause = self._cause(stop)
            # Hosts lost together are judged together: every other host that lost its connection or
            # left its tasks without an exit status.
            others = [] if stop.status == runrecord.INTERRUPTED else judge_others(
                stop.status, [Seen(t.plan, t.proc.lost(), t.returncode is not None) for t in self._last_attempt[1]],
                cause.host if cause is not None else None, self.hosts.login_ok)
            if cause is not None:
                self.record.attempt_cause({**cause.to_dict(), **({"also": [c.to_dict() for c in others]} if others else {})})
            for judged in ([cause] if cause is not None else []) + others:
                self.output.notice(f"attempt {attempt + 1} failed: {judged.kind}"
                                   f"{f' ({judged.task} on {judged.host})' if judged.task else ''}: {judged.detail}")
            after = self.policy.after(stop, cause, progress, others)
            if progress is not None:
                self.best_step = max(progress, self.best_step or 0)
            if isinstance(after, policy.Restart) and (cause or others):
                self.costs.append(_Cost(cause or others[0], time.time(), lost))
            # This machine is never left out: the launcher runs on it.
            leave = [h for h in after.left_out if any(p.host == h and not p.local for p in self.plans)] \
                if isinstance(after, policy.Restart) else []
            if leave:
                self._leave_out(leave, stop, ([cause] if cause is not None else []) + others, attempt)
            if isinstance(after, policy.GiveUp):
                summary = self._summary(stop, attempt)
                if cause is not None and cause.kind in (causes.KILLED, *causes.HOST_CAUSES):  # else the head says it
                    summary = f"{summary}\ncause: {cause.kind}: {cause.detail}"
                if after.reason:
                    summary = f"{summary}\nstopped restarting: {after.reason}"
                raise _RunFailed(stop.status, TaskFailed(summary))
            self.output.notice(after.notice)
            attempt += 1

    # -- one attempt -------------------------------------------------------------

    def _attempt(self, attempt: int) -> policy.Stop:
        self.record.attempt_started(attempt)
        tasks: list[_Task] = []
        stop = policy.Stop(runrecord.FAILED)
        begun: Attempt | None = None
        try:
            begun = self.backend.begin_attempt(self.plans, attempt)
            if not self._start_all(begun, attempt, tasks):
                stop = policy.Stop(runrecord.INTERRUPTED, signum=self.signals.received[0])
                return stop
            stop = self._watch(tasks)
            return stop
        finally:
            self._last_attempt = (attempt, tasks)
            # How each task had ended when the attempt stopped: what mgpu's own signals did after is not theirs.
            self._codes_at_stop = {t.plan.name: t.returncode for t in tasks}
            self._stop(tasks)
            self._release(tasks)
            if begun is not None:
                begun.end()
            if stop.status == runrecord.STALLED:
                self._keep_stacks(tasks, attempt)
            self.record.attempt_ended(stop.status)

    def _start_all(self, begun: Attempt, attempt: int, tasks: list[_Task]) -> bool:
        """Start the attempt's tasks, adding each that started to `tasks`, in plan order; False when
        a signal came first. Tasks whose backend allows it start at once, from threads: over SSH each
        start waits for a remote login shell, and one after another those waits add up with the
        hosts. The first error, in plan order, is raised once every start has returned, so that
        every task that did start is in `tasks`, to be stopped with the attempt."""
        together = [plan for plan in self.plans if begun.starts_together(plan)]
        outputs: dict[str, TaskOutput] = {}
        procs: dict[str, TaskProcess] = {}
        error: BaseException | None = None
        interrupted = False
        try:
            for plan in self.plans:
                outputs[plan.name] = self.output.open_task(plan, attempt)
            with concurrent.futures.ThreadPoolExecutor(min(len(together), MAX_STARTS_AT_ONCE) or 1,
                                                       thread_name_prefix="start") as pool:
                pending = {plan.name: pool.submit(begun.start, self._with_start_env(plan, attempt))
                           for plan in together}
                for plan in self.plans:
                    if plan.name in pending:
                        # In steps of POLL_INTERVAL: a signal the kernel handed to a start's thread
                        # is handled only once this (the main) thread runs again.
                        while not pending[plan.name].done():
                            concurrent.futures.wait((pending[plan.name],), POLL_INTERVAL)
                        try:
                            procs[plan.name] = pending[plan.name].result()
                        except BaseException as e:  # noqa: BLE001 - raised below, after the others returned
                            error = error or e
                    elif error is None and not interrupted:
                        if self.signals.received:
                            interrupted = True
                            continue
                        try:
                            procs[plan.name] = begun.start(self._with_start_env(plan, attempt))
                        except BaseException as e:  # noqa: BLE001
                            error = e
        finally:
            for plan in self.plans:
                output = outputs.get(plan.name)
                proc = procs.get(plan.name)
                if proc is None:
                    if output is not None:
                        output.close()
                    continue
                output.attach(proc.stdout, proc.stderr)
                self.record.task_started(plan, proc.pid, log_name(plan))
                tasks.append(_Task(plan, proc, output, sidecar=plan.type in self.sidecar_types, attempt=attempt))
        if error is not None:
            raise error
        return not interrupted

    def _role(self, task: _Task) -> policy.TaskRole:
        plan = task.plan
        # No ready line and no port, or a backend that cannot tell whether it joined: ready once started.
        unknowable = not plan.waits_for_ready and (
            plan.port is None or task.proc.joined(plan.port, self.coordinator_port) is None)
        return policy.TaskRole(plan.name, sidecar=task.sidecar, ready_when_started=unknowable,
                               ready_by_joining=not unknowable and task.started_by_joining,
                               serves=plan.type in self.server_types)

    def _watch(self, tasks: list[_Task]) -> policy.Stop:
        """The one loop of an attempt: report what happened to the policy, do what it decides."""
        by_name = {t.plan.name: t for t in tasks}
        signals_seen = 0
        output_seen = {t.plan.name: t.output.last_activity for t in tasks}
        next_flush = time.monotonic() + LOG_FLUSH_INTERVAL
        next_progress = time.monotonic()
        # Real time, not self.clock: shares are CPU seconds over wall seconds.
        compared = (pace.compared([(t.plan.name, t.plan.type, t.plan.host) for t in tasks], self.sidecar_types,
                                  self.server_types) if self.options.slow_window else {})
        paced = pace.Training(compared, window=self.options.slow_window or pace.WINDOW, named=self._named_slowest)
        next_pace = time.monotonic()
        decisions = self.policy.begin_attempt([self._role(t) for t in tasks], self.clock())
        while True:
            watch = self._carry_out(decisions, by_name)
            if isinstance(watch, policy.Stop):
                return watch
            self._check_hang_up()
            if time.monotonic() >= next_progress:
                for task in tasks:
                    self.record.task_progress(task.plan, *task.output.progress.snapshot())
                next_progress = time.monotonic() + runrecord.PROGRESS_INTERVAL
            if paced.hosts and time.monotonic() >= next_pace:
                self._pace(paced, tasks)
                next_pace = time.monotonic() + pace.SAMPLE_INTERVAL
            self.record.flush()
            if time.monotonic() > next_flush:
                for task in tasks:
                    task.output.flush()
                next_flush = time.monotonic() + LOG_FLUSH_INTERVAL
            time.sleep(max(0.0, min(POLL_INTERVAL, watch.until - self.clock())))
            now = self.clock()

            # What happened since the last look, as events.
            events: list[policy.Event] = [policy.SignalReceived(s) for s in self.signals.received[signals_seen:]]
            signals_seen = len(self.signals.received)
            events += [policy.TaskEnded(t.plan.name, t.returncode) for t in self._poll(tasks)]
            for task in tasks:
                name = task.plan.name
                if task.output.ready.is_set():
                    events.append(policy.ReadyLineSeen(name))
                if task.output.last_activity != output_seen[name]:  # read since the last look
                    output_seen[name] = task.output.last_activity
                    events.append(policy.OutputSeen(name, now))
            for name in watch.probe_joins:
                task = by_name[name]
                if task.returncode is None and task.proc.joined(task.plan.port, self.coordinator_port):
                    events.append(policy.JoinSeen(name))
            for name in watch.sample_cpu:
                cpu = by_name[name].proc.cpu_seconds()
                if cpu is not None:
                    events.append(policy.CpuSeen(name, cpu))
            decisions = self.policy.on(events, now)

    def _pace(self, paced: pace.Training, tasks: list[_Task]) -> None:
        """Feed what each running training task shows (ready, progress, CPU sample, time split) to the
        pace rule; name the slow task once it shows; record every task's busy share."""
        now = time.monotonic()
        for task in tasks:
            if task.returncode is None and task.plan.name in paced.hosts:
                usage = task.proc.usage()
                paced.see(task.plan.name, pace.Seen(
                    task.ready_at is not None, task.output.progress.step is not None,
                    None if usage is None else (usage.at, usage.runnable_seconds), task.output.time_split.total()), now)
        slowest = paced.slowest(now)
        if slowest is not None:
            self.output.notice(slowest.text())
            self.record.attempt_slowest(slowest.to_dict())
        source, shares = paced.shares(now)
        for task in tasks:
            share = shares.get(task.plan.name)
            self.record.task_busy(task.plan, None if share is None else
                                  {"share": round(share, 3), "source": source, "window_s": paced.window})

    def _carry_out(self, decisions: list[policy.Decision], by_name: dict[str, _Task]) -> policy.Watch | policy.Stop:
        """Notices to the console, readiness and ignored failures to the record; returns the last
        decision (what to do next)."""
        for decision in decisions:
            if isinstance(decision, policy.Notice):
                self.output.notice(decision.text)
            elif isinstance(decision, policy.Ready):
                by_name[decision.name].ready_at = time.time()
                self.record.task_ready(by_name[decision.name].plan)
            elif isinstance(decision, policy.FailureIgnored):
                self.record.task_failure_ignored(by_name[decision.name].plan)
        last = decisions[-1]
        assert isinstance(last, (policy.Watch, policy.Stop))
        if isinstance(last, policy.Stop):
            if last.status == runrecord.START_TIMEOUT:
                for name in last.missing:  # for the report: whether each had joined, where that is known
                    task = by_name[name]
                    if task.plan.port is not None:
                        task.joined = task.proc.joined(task.plan.port, self._dialled_port(task))
            elif last.status == runrecord.STALLED:
                self._ask_for_stacks(list(by_name.values()))
        return last

    def _ask_for_stacks(self, tasks: list[_Task]) -> None:
        """SIGABRT to every task: faulthandler writes each Python thread's stack, then the process
        ends. Waits (bounded) for them to end, so that the stacks are in the logs."""
        self._stopped_at = time.time()  # a task that ended before it ended on its own (the report says so)
        running = [t for t in tasks if t.returncode is None]
        for task in running:
            task.output.mute_console()  # the report sums the stacks up; the logs keep them
            task.proc.dump_stacks()
        deadline = time.monotonic() + STACKS_TIMEOUT
        while any(t.returncode is None for t in running) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
            self._poll(tasks)

    def _keep_stacks(self, tasks: list[_Task], attempt: int) -> None:
        """The stacks each task printed, in the run dir: stacks-<attempt>.txt."""
        text = []
        for task in tasks:
            dump = stacks.dump_lines([line.text for line in task.output.tail])
            text.append(f"===== {task.plan.name} on {task.plan.host} =====\n")
            text.extend(line + "\n" for line in dump or ["(no Python stack)"])
        name = stacks_file_name(attempt)
        try:
            with open(self.run_dir.create(name), "w", encoding="utf-8", errors="replace") as f:
                f.writelines(text)
        except OSError as exc:  # a full disk: the logs may still have them
            self.output.notice(f"cannot write {name} in {self.run_dir.path}: {exc.strerror or exc}")

    def _dialled_port(self, task: _Task) -> int | None:
        """The coordinator's port, where a connection to it counts as joining (not for a program
        that prints the ready line: TensorFlow's workers dial the coordinator long before that)."""
        return None if task.plan.waits_for_ready else self.coordinator_port

    def _poll(self, tasks: list[_Task]) -> list[_Task]:
        """Collect exit codes; return the tasks found ended by this call."""
        ended = []
        for task in tasks:
            if task.returncode is None:
                returncode = task.proc.poll()
                if returncode is not None:
                    task.returncode = returncode
                    task.ended_at = time.time()
                    self.record.task_ended(task.plan, returncode)
                    ended.append(task)
        return ended

    # -- stopping ----------------------------------------------------------------

    def _stop(self, tasks: list[_Task]) -> None:
        """TERM every task's tree and every tagged process, KILL after the grace period,
        then scan for anything of the run still alive. Also run after success."""
        signals_seen = len(self.signals.received)
        strays = self.backend.strays(self.options.run_id, self.launch_id)
        for task in tasks:
            task.proc.signal_tree(signal.SIGTERM)
        strays.signal(signal.SIGTERM)

        deadline = time.monotonic() + self.options.grace_period
        while True:
            self._check_hang_up()
            self._poll(tasks)
            if not strays.alive() and all(t.returncode is not None for t in tasks):
                break
            # A Ctrl-C with another signal, or during the stop; another SIGTERM waits for it.
            if self.signals.kill_now(signals_seen):
                self.output.notice("second signal: killing all tasks now")
                break
            if time.monotonic() >= deadline:
                names = ", ".join(t.plan.name for t in tasks if t.returncode is None)
                self.output.notice(f"grace period over; killing {names or 'leftover processes'}")
                break
            time.sleep(POLL_INTERVAL)

        if strays.alive() or any(t.returncode is None for t in tasks):
            for task in tasks:
                task.proc.signal_tree(signal.SIGKILL)
            strays.signal(signal.SIGKILL)
            deadline = time.monotonic() + REAP_TIMEOUT
            while any(t.returncode is None for t in tasks) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL)
                self._poll(tasks)

        leftovers = self.backend.sweep(self.options.run_id, self.options.grace_period, self.launch_id)
        if leftovers:
            self.output.notice(f"stopped {leftovers} leftover processes of run {self.options.run_id}")

    # -- the terminal ----------------------------------------------------------------

    def _check_hang_up(self) -> None:
        """SIGHUP: the terminal is gone (closed, or the SSH session to this machine); the run goes on."""
        if self.signals.hung_up and not self.console_moved:
            self._move_console()
            self.output.notice(f"the terminal hung up (SIGHUP); the run goes on: `mgpu status {self.options.run_id}`, "
                               f"`mgpu stop {self.options.run_id}`")

    def _move_console(self) -> None:
        """From now on the console is <run dir>/console.log: mgpu's own output (standard output and error,
        so its last line too) and the tasks' view; standard input is /dev/null."""
        fd = self.run_dir.open_log(CONSOLE_LOG)
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # a terminal already gone: what it held is lost
                    pass
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            self.output.redirect_console(open(fd, "w", encoding="utf-8", errors="replace", closefd=True))
        except BaseException:
            os.close(fd)
            raise
        self.console_moved = True

    def _release(self, tasks: list[_Task]) -> None:
        """Let every task's output reach end of file (one deadline for all), then close the
        streams and logs, also where a leftover process outside the run still holds a pipe."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        still_open = [t.plan.name for t in tasks if not t.output.drained(max(0.0, deadline - time.monotonic()))]
        if still_open:
            self.output.notice(f"output of {', '.join(still_open)} still open after stop; not waiting for it")
        for task in tasks:
            task.proc.close()
            task.output.close()
            self.record.task_progress(task.plan, *task.output.progress.snapshot())  # as the task left it

    # -- hosts left out --------------------------------------------------------------

    def _leave_out(self, hosts: list[str], stop: policy.Stop, judged: list[causes.Cause], attempt: int) -> None:
        """Give the tasks of every host in `hosts` to a spare of its own and plan again, or stop the
        run naming them and the command that relaunches without any host found lost."""
        placement = self.hosts.replace(hosts, self.output.notice)
        judged = judged + [causes.Cause(causes.NETWORK, None, host, "the spares' check could not reach it")
                           for host in placement.gone]  # found gone after the attempt: left out too
        why = {host: next((f"{c.kind}: {c.detail}" for c in judged if c.host == host), "failed")
               for host in (*hosts, *placement.gone)}
        self.left_out.extend(host for host in why if host not in self.left_out)
        if placement.plans is None:
            head = left_out_head(why, [plan.name for plan in self.plans if plan.host in why],
                                 self.hosts.relaunch(tuple(self.left_out)))
            raise _RunFailed(stop.status, TaskFailed(f"{head}\n{self._summary(stop, attempt)}"))
        took = {host: f"{spare} took {', '.join(plan.name for plan in self.plans if plan.host == host)}"
                for host, spare in placement.took}
        for host in took:
            self.output.notice(f"{host} left out for the rest of the run ({why[host]}); {took[host]}")
        self.plans = list(placement.plans)
        self.coordinator_port = self.plans[0].coordinator_port
        if self.costs:
            cost = self.costs[-1]
            cost.left_out, cost.took = cost.cause.host in took, took.get(cost.cause.host)
            cost.others = tuple((c, took[c.host]) for c in judged if c.host in took and c.host != cost.cause.host)

    # -- what failures cost ---------------------------------------------------------

    def _record_cost(self, started: float, stop: policy.Stop, progress: int | None) -> float:
        """The last attempt's ready time, progress and time lost, into its record; returns the time lost.

        A failed attempt loses the time since its last new step (the work after it is redone), or
        all of it when it reported no step beyond the best before it."""
        _, tasks = self._last_attempt
        ended = time.time()
        training = [t for t in tasks if not t.sidecar] or tasks
        ready_times = [t.ready_at for t in training]
        ready = max(ready_times) if ready_times and None not in ready_times else None
        gained = None
        if progress is not None:
            gained = max(0, progress - (self.best_step or 0))
        lost = 0.0
        if stop.status not in (runrecord.SUCCEEDED, runrecord.INTERRUPTED):  # an interrupted run was ended on purpose
            last_new = None
            if gained:
                last_new = max((t.output.progress.step_at for t in tasks if t.output.progress.step == progress),
                               default=None)
            lost = max(0.0, ended - (last_new or started))
        self.record.attempt_costs(
            ready_at=runrecord.utc(ready) if ready is not None else None,
            progress={"last_step": progress, "gained": gained} if progress is not None else None,
            time_lost_s=round(lost, 3))
        return lost

    def _totals(self, wall: float) -> dict:
        lost = sum(c.lost for c in self.costs)
        return {
            "restarts": len(self.costs),
            "left_out": [{"host": cause.host, "cause": cause.kind, "at": runrecord.utc(c.at), "replaced_by": took}
                         for c in self.costs for cause, took in ((c.cause, c.took),) * c.left_out + c.others],
            "time_lost_s": round(lost, 3),
            "wall_s": round(wall, 3),
            "goodput": round(max(0.0, wall - lost) / wall, 4) if wall > 0 else None,
        }

    # -- why an attempt failed ------------------------------------------------------

    def _progress(self) -> int | None:
        """The highest step the last attempt's tasks reported; None if none did."""
        _, tasks = self._last_attempt
        steps = [t.output.progress.step for t in tasks if t.output.progress.step is not None]
        return max(steps) if steps else None

    def _cause(self, stop: policy.Stop) -> causes.Cause | None:
        """The cause of the last attempt's failure, charged to a task and its host."""
        _, tasks = self._last_attempt
        by_name = {t.plan.name: t for t in tasks}
        charged: _Task | None = None
        if stop.status == runrecord.FAILED and stop.failed in by_name:
            failed = by_name[stop.failed]
            peers = [t for t in tasks if t is not failed and not t.sidecar]
            view = at_fault(self._view(failed), [self._view(t) for t in peers])
            charged = by_name[view.name]
        elif stop.status == runrecord.START_TIMEOUT and stop.missing:
            charged = by_name.get(stop.missing[0])
        # A task whose host stopped answering is charged before any other: the others' failures follow from it.
        lost = next((t for t in tasks if t.proc.lost() is not None), None)
        if lost is not None and stop.status != runrecord.INTERRUPTED:
            charged = lost
        if charged is None:
            return causes.classify(causes.Evidence(stop.status, progress=self._progress()))
        reason = charged.proc.lost()
        login_ok = None
        code = self._codes_at_stop.get(charged.plan.name)
        if reason is None and charged is not by_name.get(stop.failed) and code is None \
                and stop.status == runrecord.FAILED:
            reason = f"{charged.plan.name} stopped answering its peers"  # blamed by them, its own end unseen
            login_ok = self.hosts.login_ok(charged.plan)
            if login_ok is not False:
                reason = None
        elif reason is not None:
            login_ok = self.hosts.login_ok(charged.plan)
        view = self._view(charged)
        unreachable = None
        said = view.hint_lines() + (self._view(by_name[stop.failed]).hint_lines() if stop.failed in by_name else [])
        if reason is None and diagnosis.NETWORK_FAILURES & set(diagnosis.known_failures(said)):
            # The task says it could not reach a peer: the reachability test, run again, names the pair.
            unreachable = self.hosts.unreachable(self.plans)
            if unreachable is not None:
                charged = next((t for t in tasks if t.plan.host == unreachable[1]), charged)
                code = self._codes_at_stop.get(charged.plan.name)
                view = self._view(charged)
        if code not in (None, 0):
            error = program_error(view)
        elif stop.failed in by_name and by_name[stop.failed] is not charged:  # blamed by the task that failed
            error = program_error(self._view(by_name[stop.failed]))
        else:
            error = None
        return causes.classify(causes.Evidence(
            stop.status, charged.plan.name, charged.plan.host, code, error=error,
            lost=reason, login_ok=login_ok, unreachable=unreachable, progress=self._progress()))

    # -- the failure summary -------------------------------------------------------

    def _summary(self, stop: policy.Stop, attempt: int) -> str:
        after = f", after {attempt} restart{'s' if attempt > 1 else ''}" if attempt > 0 else ""
        _, tasks = self._last_attempt
        if stop.status == runrecord.STALLED:
            head = f"stall: no training task made progress for {stop.idle_for:.0f} s{after}"
            training = [self._view(t) for t in tasks if not t.sidecar]
            return stall_summary(head, training, self.run_dir / stacks_file_name(attempt), self.options.stall_timeout,
                                 self._stopped_at)
        if stop.status == runrecord.START_TIMEOUT:
            names = ", ".join(stop.missing)
            head = f"start timeout: {names} not ready after {self.options.start_timeout:g} s{after}"
            return start_timeout_summary(head, [self._view(t) for t in tasks if t.plan.name in stop.missing])
        task = next(t for t in tasks if t.plan.name == stop.failed)
        peers = [self._view(t) for t in tasks if t is not task and not t.sidecar]
        return failure_summary(self._view(task), peers, after)

    def _with_start_env(self, plan: TaskPlan, attempt: int) -> TaskPlan:
        """The plan with the launch's id (protocol.ENV_LAUNCH_ID) added, and for a task on this machine
        (whose path the task can write to; the run dir is not on SSH or Slurm hosts) its error file,
        under mgpu's name and torch's, so that torch's `@record` writes there too (error_file.parse
        reads either format)."""
        added = {protocol.ENV_LAUNCH_ID: self.launch_id}
        if self.backend.writes_here(plan):
            # Absolute: the task's workdir may not be the launcher's.
            path = (self.run_dir / error_file.file_name(plan.type, plan.index, attempt)).absolute()
            added[protocol.ENV_ERROR_FILE] = str(path)
            added[protocol.ENV_TORCHELASTIC_ERROR_FILE] = str(path)
        return dataclasses.replace(plan, env=collections.ChainMap(added, plan.env))

    def _view(self, task: _Task) -> TaskView:
        plan = task.plan
        error = None
        if task.returncode not in (None, 0) and self.backend.writes_here(plan):
            error = error_file.read(error_file.file_name(plan.type, plan.index, task.attempt), self.run_dir.fd)
        return TaskView(plan.name, plan.host, plan.port, plan.waits_for_ready, list(task.output.tail),
                        task.output.log_path, joined=task.joined, coordinator_port=self._dialled_port(task),
                        returncode=task.returncode, ended_at=task.ended_at, bind_failure=task.output.bind_failure,
                        error=error)
