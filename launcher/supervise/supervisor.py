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
  up to max_preemption_restarts times.
- Stalls: once every task is ready, a run in which no training task makes
  progress (output, or CPU use: stall.py) for the stall timeout is stalled:
  every task gets SIGABRT, on which faulthandler (PYTHONFAULTHANDLER, set for
  every task) prints each Python thread's stack into its log; the report says
  where each task was and names the tasks not waiting in the framework (the
  likely cause), and the stacks are kept in the run dir. A stall is a failure:
  max_restarts applies.
- Signals: SIGINT, SIGTERM or SIGHUP to the launcher stop every task the same
  way (a second one skips the grace period), then raise Interrupted.
- Nothing is left behind: every stop ends with the backend's sweep for processes
  of the run (locally: those carrying the run's MGPU_RUN_ID), and the backend's
  reaper (reaper.py) does the same for this machine if the launcher dies, and records the run as
  launcher-died. Hence a run id must not be in use
  by live processes when a run starts.
"""

from __future__ import annotations

import collections
import dataclasses
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
from launcher.supervise import policy, stacks
from launcher.supervise.rundir import RunDir, make_run_dir
from launcher.supervise.summary import (
    TaskView, closing_line, failure_summary, stall_summary, start_timeout_summary,
)
from launcher.backends.base import Attempt, Backend, TaskProcess
from launcher.supervise.reaper import Reaper

POLL_INTERVAL = 0.05
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
) -> None:
    """Run the tasks until all exit 0 (return), one fails (TaskFailed) or a signal arrives (Interrupted).

    Run files (run.json, <type>-<index>.log, reaper.log) go to options.log_dir / options.run_id.
    `backend` runs every task (Routed, for a run that mixes kinds of tasks); it stays open:
    whoever made it closes it. `clock` is the policy's (its deadlines and the stall clock): a test
    may move it on an event.
    """
    if not plans:
        raise UsageError("no tasks to run")
    run_dir = make_run_dir(options)
    try:
        _Supervisor(plans, backend, options, console, run_dir, clock).run()
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

    @property
    def started_by_joining(self) -> bool:
        """Ready once it joins the cluster: a program without the ready line, in the cluster."""
        return not self.plan.waits_for_ready and self.plan.port is not None


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
    ):
        self.clock = clock
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
        recorded_options = {
            "grace_period": options.grace_period,
            "start_timeout": options.start_timeout,
            "max_restarts": options.max_restarts,
            "stall_timeout": options.stall_timeout,
            "max_preemption_restarts": options.max_preemption_restarts,
            "log_dir": str(options.log_dir),
        }
        # Tags this launch's processes beside the run id (protocol.ENV_LAUNCH_ID).
        self.launch_id = secrets.token_hex(8)
        self.record = runrecord.RunRecord(run_dir, options.run_id, self.plans, recorded_options, options.show_secrets)
        self.output = RunOutput(run_dir, console, options.timestamps, options.show, options.show_tf_logs)
        self._last_attempt: tuple[int, list[_Task]] = (0, [])
        self.policy = policy.Policy(
            policy.Rules(start_timeout=options.start_timeout, stall_timeout=options.stall_timeout,
                         max_restarts=options.max_restarts, max_preemption_restarts=options.max_preemption_restarts),
            grace_period=options.grace_period)

    # -- the whole run ---------------------------------------------------------

    def run(self) -> None:
        reaper: Reaper | None = None
        final = (runrecord.FAILED, None)
        started = time.monotonic()
        try:
            with self.signals:
                # The record's guard, for every run: if the launcher dies, run.json still says so.
                reaper = Reaper.start(self.options.run_id, self.options.grace_period, self.run_dir, self.launch_id)
                self.backend.check_ports(self.plans)
                final = self._attempts()
                attempt, tasks = self._last_attempt
                succeeded = sum(t.returncode == 0 for t in tasks)
                self.output.notice(closing_line(len(tasks), succeeded, time.monotonic() - started, attempt, self.run_dir.path))
        except Interrupted as e:
            final = (runrecord.INTERRUPTED, str(e))
            raise
        except _RunFailed as e:
            final = (e.status, str(e.error))
            raise e.error from None
        except MgpuError as e:
            final = (runrecord.FAILED, str(e))
            raise
        finally:
            self.record.finish(*final)
            try:
                if reaper is not None:  # every task is gone and the record final: nothing left to guard
                    reaper.dismiss()
            finally:
                self.output.close()  # as long as the console takes: mgpu's own lines are never dropped

    def _attempts(self) -> tuple[str, None]:
        attempt = 0
        while True:
            stop = self._attempt(attempt)
            if stop.status == runrecord.SUCCEEDED:
                return runrecord.SUCCEEDED, None
            if self.signals.received:
                raise Interrupted(self.signals.received[0])
            after = self.policy.after(stop)
            if isinstance(after, policy.GiveUp):
                raise _RunFailed(stop.status, TaskFailed(self._summary(stop, attempt)))
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
            for plan in self.plans:
                if self.signals.received:
                    stop = policy.Stop(runrecord.INTERRUPTED, signum=self.signals.received[0])
                    return stop
                tasks.append(self._start(begun, plan, attempt))
            stop = self._watch(tasks)
            return stop
        finally:
            self._last_attempt = (attempt, tasks)
            self._stop(tasks)
            self._release(tasks)
            if begun is not None:
                begun.end()
            if stop.status == runrecord.STALLED:
                self._keep_stacks(tasks, attempt)
            self.record.attempt_ended(stop.status)

    def _start(self, begun: Attempt, plan: TaskPlan, attempt: int) -> _Task:
        output = self.output.open_task(plan, attempt)
        try:
            proc = begun.start(self._with_start_env(plan, attempt))
        except BaseException:
            output.close()
            raise
        output.attach(proc.stdout, proc.stderr)
        self.record.task_started(plan, proc.pid, log_name(plan))
        return _Task(plan, proc, output, sidecar=plan.type in self.sidecar_types, attempt=attempt)

    def _role(self, task: _Task) -> policy.TaskRole:
        plan = task.plan
        # No ready line and no port, or a backend that cannot tell whether it joined: ready once started.
        unknowable = not plan.waits_for_ready and (
            plan.port is None or task.proc.joined(plan.port, self.coordinator_port) is None)
        return policy.TaskRole(plan.name, sidecar=task.sidecar, ready_when_started=unknowable,
                               ready_by_joining=not unknowable and task.started_by_joining)

    def _watch(self, tasks: list[_Task]) -> policy.Stop:
        """The one loop of an attempt: report what happened to the policy, do what it decides."""
        by_name = {t.plan.name: t for t in tasks}
        signals_seen = 0
        output_seen = {t.plan.name: t.output.last_activity for t in tasks}
        next_flush = time.monotonic() + LOG_FLUSH_INTERVAL
        decisions = self.policy.begin_attempt([self._role(t) for t in tasks], self.clock())
        while True:
            watch = self._carry_out(decisions, by_name)
            if isinstance(watch, policy.Stop):
                return watch
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

    def _carry_out(self, decisions: list[policy.Decision], by_name: dict[str, _Task]) -> policy.Watch | policy.Stop:
        """Notices to the console, readiness and ignored failures to the record; returns the last
        decision (what to do next)."""
        for decision in decisions:
            if isinstance(decision, policy.Notice):
                self.output.notice(decision.text)
            elif isinstance(decision, policy.Ready):
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
        fd = self.run_dir.create(stacks_file_name(attempt))
        with open(fd, "w", encoding="utf-8", errors="replace") as f:
            f.writelines(text)

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
            self._poll(tasks)
            if not strays.alive() and all(t.returncode is not None for t in tasks):
                break
            if len(self.signals.received) > signals_seen:
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

    # -- the failure summary -------------------------------------------------------

    def _summary(self, stop: policy.Stop, attempt: int) -> str:
        after = f", after {attempt} restart{'s' if attempt > 1 else ''}" if attempt > 0 else ""
        _, tasks = self._last_attempt
        if stop.status == runrecord.STALLED:
            head = f"stall: no training task made progress for {stop.idle_for:.0f} s{after}"
            training = [self._view(t) for t in tasks if not t.sidecar]
            return stall_summary(head, training, self.run_dir / stacks_file_name(attempt))
        if stop.status == runrecord.START_TIMEOUT:
            names = ", ".join(stop.missing)
            head = f"start timeout: {names} not ready after {self.options.start_timeout:g} s{after}"
            return start_timeout_summary(head, [self._view(t) for t in tasks if t.plan.name in stop.missing])
        task = next(t for t in tasks if t.plan.name == stop.failed)
        peers = [self._view(t) for t in tasks if t is not task and not t.sidecar]
        return failure_summary(self._view(task), peers, after)

    def _with_start_env(self, plan: TaskPlan, attempt: int) -> TaskPlan:
        """The plan with the launch's id (protocol.ENV_LAUNCH_ID) added, and protocol.ENV_ERROR_FILE
        for a task on this machine (whose path the task can write to; the run dir is not on SSH or
        Slurm hosts)."""
        added = {protocol.ENV_LAUNCH_ID: self.launch_id}
        if self.backend.writes_here(plan):
            # Absolute: the task's workdir may not be the launcher's.
            path = (self.run_dir / error_file.file_name(plan.type, plan.index, attempt)).absolute()
            added[protocol.ENV_ERROR_FILE] = str(path)
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
