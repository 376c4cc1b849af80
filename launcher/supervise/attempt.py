"""One attempt's processes, after torch's PContext: `start` every task, `poll` what they did into
the policy's events, `collect` evidence while they live (evidence.py), `stop` them (TERM, the
grace period, KILL, the sweep for strays) and `close` (their output drained, their logs closed).

The supervisor keeps the loop and the record of the whole run; an Attempt knows only its own
tasks, through the backend, and the few parts of the run it reports to (the output, the record)."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import signal
import time
from typing import Callable, Sequence

from launcher import error_file, protocol
from launcher.backends.base import Backend, TaskProcess
from launcher.plan.planner import TaskPlan
from launcher.supervise import diagnosis, flight_env, policy
from launcher.supervise.output import RunOutput, TaskOutput, log_name
from launcher.supervise.runrecord import RunRecord
from launcher.supervise.rundir import RunDir
from launcher.supervise.signals import Signals
from launcher.supervise.spy_stacks import TaskStacks
from launcher.supervise.summary import TaskView

POLL_INTERVAL = 0.05
# Tasks started at once where their backend allows it (each start is a thread waiting on a remote shell).
MAX_STARTS_AT_ONCE = 32
REAP_TIMEOUT = 5.0  # after KILL, how long a task may take to be reported gone
DRAIN_TIMEOUT = 5.0  # after the tasks are gone, how long their output may take to reach end of file


def wait_until(done: Callable[[], bool], timeout: float, between: Callable[[], None] = lambda: None) -> bool:
    """The one bounded wait: `between`, then `done`, every POLL_INTERVAL until `done` says so
    (True) or `timeout` seconds of real time have passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        between()
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


@dataclasses.dataclass(frozen=True)
class TaskKinds:
    """Which of a run's task types are sidecars (their failure does not stop training) and which
    serve until stopped (ParameterServerStrategy's workers and parameter servers)."""
    sidecars: frozenset[str]
    servers: frozenset[str]

    @classmethod
    def of(cls, plans: Sequence[TaskPlan]) -> "TaskKinds":
        types = frozenset(p.type for p in plans)
        training = types & frozenset(protocol.TRAINING_TASK_TYPES)
        # Without training tasks, nothing is a sidecar: every task counts.
        return cls(types - training if training else frozenset(),
                   frozenset({"worker", "ps"}) if "ps" in types else frozenset())


@dataclasses.dataclass
class AttemptTask:
    plan: TaskPlan
    proc: TaskProcess
    output: TaskOutput
    sidecar: bool  # its failure does not stop training
    attempt: int
    returncode: int | None = None
    ended_at: float | None = None  # when its end was seen, seconds since the epoch
    joined: bool | None = None  # known at a start timeout: whether it had joined; None: unknown
    ready_at: float | None = None  # when it was recorded ready, seconds since the epoch
    stopped_at: float | None = None  # when it was seen stopped (SIGSTOP); None: running at the last look
    # A task stopped when the attempt stopped: its output until then. What it prints once the stop
    # continues it (its peers gone) follows from the stop, and is no evidence of why the attempt failed.
    tail_at_stop: list[diagnosis.TaskLine] | None = None

    @property
    def started_by_joining(self) -> bool:
        """Ready once it joins the cluster: a program without the ready line, in the cluster."""
        return not self.plan.waits_for_ready and self.plan.port is not None


class Attempt:
    """The tasks of attempt `number` of a run."""

    def __init__(self, number: int, plans: Sequence[TaskPlan], backend: Backend, *, run_id: str, launch_id: str,
                 kinds: TaskKinds, output: RunOutput, record: RunRecord, run_dir: RunDir, signals: Signals,
                 on_each_wait: Callable[[], None] = lambda: None):
        """`launch_id` tags this launch's processes beside `run_id` (protocol.ENV_LAUNCH_ID);
        `on_each_wait` runs at every step of a wait (the supervisor's look at the terminal)."""
        self.number = number
        self.plans = list(plans)
        self.backend = backend
        self.run_id = run_id
        self.launch_id = launch_id
        self.kinds = kinds
        self.output = output
        self.record = record
        self.run_dir = run_dir
        self.signals = signals
        self.on_each_wait = on_each_wait
        # Process 0 of JAX and PyTorch: the first member of the cluster, whose port the others dial.
        self.coordinator_port = self.plans[0].coordinator_port
        self.tasks: list[AttemptTask] = []
        self.replaced: list[AttemptTask] = []  # tasks that ended and were restarted in place
        self.codes_at_stop: dict[str, int | None] = {}  # how each task had ended when the attempt stopped
        self.stacks_asked_at: float | None = None  # when a stall's evidence asked the tasks for their stacks
        self.spied: dict[str, "TaskStacks"] = {}  # each task's stacks as py-spy read them (evidence.py)
        self.flight: dict | None = None  # the flight recorder's dumps and verdict on a stall (flight_recorder.py)
        self._begun = None
        self._signals_seen = 0
        self._output_seen: dict[str, float] = {}

    @property
    def by_name(self) -> dict[str, AttemptTask]:
        return {t.plan.name: t for t in self.tasks}

    # -- start -------------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the tasks, in plan order; False when a stop signal came first. Tasks whose backend
        allows it start at once, from threads: over SSH each start waits for a remote login shell,
        and one after another those waits add up with the hosts. The first error, in plan order, is
        raised once every start has returned, so that every task that did start is in `tasks`, to
        be stopped with the attempt."""
        self._begun = begun = self.backend.begin_attempt(self.plans, self.number)
        together = [plan for plan in self.plans if begun.starts_together(plan)]
        outputs: dict[str, TaskOutput] = {}
        procs: dict[str, TaskProcess] = {}
        error: BaseException | None = None
        interrupted = False
        try:
            for plan in self.plans:
                outputs[plan.name] = self.output.open_task(plan, self.number)
            with concurrent.futures.ThreadPoolExecutor(min(len(together), MAX_STARTS_AT_ONCE) or 1,
                                                       thread_name_prefix="start") as pool:
                pending = {plan.name: pool.submit(begun.start, self._with_start_env(plan)) for plan in together}
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
                            procs[plan.name] = begun.start(self._with_start_env(plan))
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
                self.tasks.append(AttemptTask(plan, proc, output, plan.type in self.kinds.sidecars, self.number))
            self._output_seen = {t.plan.name: t.output.last_activity for t in self.tasks}
        if error is not None:
            raise error
        return not interrupted

    def restart_task(self, name: str) -> None:
        """Start the ended task `name` again, in place, in this attempt (policy.RestartTask): its
        output goes on in the same log; its earlier process is closed with the attempt."""
        index, old = next((i, t) for i, t in enumerate(self.tasks) if t.plan.name == name)
        output = self.output.open_task(old.plan, self.number)
        try:
            proc = self._begun.start(self._with_start_env(old.plan))
        except BaseException:
            output.close()
            raise
        output.attach(proc.stdout, proc.stderr)
        self.record.task_restarted_in_place(old.plan, proc.pid)
        self.replaced.append(old)
        self.tasks[index] = AttemptTask(old.plan, proc, output, old.sidecar, self.number, ready_at=old.ready_at)
        self._output_seen[name] = output.last_activity

    def _with_start_env(self, plan: TaskPlan) -> TaskPlan:
        """The plan with the launch's id (protocol.ENV_LAUNCH_ID) added, and for a task on this machine
        (whose path the task can write to; the run dir is not on SSH or Slurm hosts) its error file,
        under mgpu's name and torch's, so that torch's `@record` writes there too (error_file.parse
        reads either format)."""
        added = {protocol.ENV_LAUNCH_ID: self.launch_id}
        if self.backend.writes_here(plan):
            # Absolute: the task's workdir may not be the launcher's.
            path = (self.run_dir / error_file.file_name(plan.type, plan.index, self.number)).absolute()
            added[protocol.ENV_ERROR_FILE] = str(path)
            added[protocol.ENV_TORCHELASTIC_ERROR_FILE] = str(path)
        here = self.backend.writes_here(plan)
        added.update(flight_env.start_env(plan, self.run_dir.path if here else None, self.number,
                                          os.environ if here else {}, run_id=self.run_id))
        return dataclasses.replace(plan, env=collections.ChainMap(added, plan.env))

    def roles(self) -> list[policy.TaskRole]:
        """What the policy must know of each task."""
        roles = []
        for task in self.tasks:
            plan = task.plan
            # No ready line and no port, or a backend that cannot tell whether it joined: ready once started.
            unknowable = not plan.waits_for_ready and (
                plan.port is None or task.proc.joined(plan.port, self.coordinator_port) is None)
            roles.append(policy.TaskRole(plan.name, sidecar=task.sidecar, ready_when_started=unknowable,
                                         ready_by_joining=not unknowable and task.started_by_joining,
                                         serves=plan.type in self.kinds.servers))
        return roles

    # -- poll --------------------------------------------------------------------------------

    def poll(self, watch: policy.Watch, now: float) -> list[policy.Event]:
        """What happened since the last look, as the policy's events seen at `now`; also does what
        `watch` asks (probe joins, sample CPU)."""
        events: list[policy.Event] = [policy.SignalReceived(s) for s in self.signals.received[self._signals_seen:]]
        self._signals_seen = len(self.signals.received)
        events += [policy.TaskEnded(t.plan.name, t.returncode) for t in self.reap()]
        by_name = self.by_name
        for task in self.tasks:
            name = task.plan.name
            if task.output.ready.is_set():
                events.append(policy.ReadyLineSeen(name))
            if task.output.last_activity != self._output_seen[name]:  # read since the last look
                self._output_seen[name] = task.output.last_activity
                events.append(policy.OutputSeen(name, now))
        for name in watch.probe_joins:
            task = by_name[name]
            if task.returncode is None and task.proc.joined(task.plan.port, self.coordinator_port):
                events.append(policy.JoinSeen(name))
        for name in watch.sample_cpu:
            cpu = by_name[name].proc.cpu_seconds()
            if cpu is not None:
                events.append(policy.CpuSeen(name, cpu))
            self._see_stopped(by_name[name])
        return events

    def _see_stopped(self, task: AttemptTask) -> None:
        self.note_stopped(task, task.proc.stopped())

    def note_stopped(self, task: AttemptTask, stopped: bool | None) -> None:
        """Note a task seen stopped, and say so once: a stall is then charged to it (causes.py)."""
        if stopped and task.stopped_at is None:
            task.stopped_at = time.time()
            self.output.notice(f"{task.plan.name} on {task.plan.host} is stopped (SIGSTOP, or a debugger): "
                               f"the other tasks wait for it until it is continued")
        elif stopped is False:
            task.stopped_at = None

    def reap(self) -> list[AttemptTask]:
        """Collect exit codes; the tasks found ended by this call."""
        ended = []
        for task in self.tasks:
            if task.returncode is None:
                returncode = task.proc.poll()
                if returncode is not None:
                    task.returncode = returncode
                    task.ended_at = time.time()
                    self.record.task_ended(task.plan, returncode)
                    ended.append(task)
        return ended

    def running(self) -> list[AttemptTask]:
        return [t for t in self.tasks if t.returncode is None]

    # -- evidence, stop, close -----------------------------------------------------------------

    def collect(self, actions: Sequence["EvidenceAction"]) -> None:
        """Carry out each evidence action in turn; one that fails is said once and never keeps the
        others, or the stop, from happening."""
        for action in actions:
            try:
                action.collect(self)
            except Exception as e:  # noqa: BLE001 - evidence is a help, never a reason to fail the stop
                self.output.notice(f"could not {action.what}: {type(e).__name__}: {e}")

    def stop(self, grace_period: float) -> None:
        """TERM every task's tree and every tagged process, KILL after the grace period, then sweep
        for anything of the run still alive. Also run after success."""
        self.codes_at_stop = {t.plan.name: t.returncode for t in self.tasks}
        signals_seen = len(self.signals.received)
        strays = self.backend.strays(self.run_id, self.launch_id)
        for task in self.running():  # looked at, not noted: a task stopped only now is not charged for it
            if task.stopped_at is not None or task.proc.stopped():
                task.tail_at_stop = list(task.output.tail)
        # SIGCONT after: a stopped task (SIGSTOP) takes the TERM now, not the KILL after the grace period.
        for signum in (signal.SIGTERM, signal.SIGCONT):
            for task in self.tasks:
                task.proc.signal_tree(signum)
            strays.signal(signum)

        why = []

        def gone_or_told_to_hurry() -> bool:
            if not strays.alive() and not self.running():
                return True
            # A Ctrl-C with another signal, or during the stop; another SIGTERM waits for it.
            if self.signals.kill_now(signals_seen):
                why.append("second signal: killing all tasks now")
                return True
            return False

        if not wait_until(gone_or_told_to_hurry, grace_period, between=self._between_waits):
            names = ", ".join(t.plan.name for t in self.running())
            why.append(f"grace period over; killing {names or 'leftover processes'}")
        if why:
            self.output.notice(why[0])

        if strays.alive() or self.running():
            for task in self.tasks:
                task.proc.signal_tree(signal.SIGKILL)
            strays.signal(signal.SIGKILL)
            wait_until(lambda: not self.running(), REAP_TIMEOUT, between=self.reap)

        leftovers = self.backend.sweep(self.run_id, grace_period, self.launch_id)
        if leftovers:
            self.output.notice(f"stopped {leftovers} leftover processes of run {self.run_id}")

    def _between_waits(self) -> None:
        self.on_each_wait()
        self.reap()

    def close(self) -> None:
        """Let every task's output reach end of file (one deadline for all), then close the streams
        and logs, also where a leftover process outside the run still holds a pipe; end the
        backend's attempt."""
        deadline = time.monotonic() + DRAIN_TIMEOUT
        still_open = [t.plan.name for t in self.tasks if not t.output.drained(max(0.0, deadline - time.monotonic()))]
        if still_open:
            self.output.notice(f"output of {', '.join(still_open)} still open after stop; not waiting for it")
        for task in self.replaced:
            task.proc.close()
            task.output.close()
        for task in self.tasks:
            task.proc.close()
            task.output.close()
            self.record.task_progress(task.plan, *task.output.progress.snapshot())  # as the task left it
        if self._begun is not None:
            self._begun.end()
        flight_env.remove_sockets(self.run_dir.unlink, self.number, self.plans)  # those a killed task left

    # -- what the attempt showed -----------------------------------------------------------------

    def progress(self) -> int | None:
        """The highest step the tasks reported; None if none did."""
        steps = [t.output.progress.step for t in self.tasks if t.output.progress.step is not None]
        return max(steps) if steps else None

    def dialled_port(self, task: AttemptTask) -> int | None:
        """The coordinator's port, where a connection to it counts as joining (not for a program
        that prints the ready line: TensorFlow's workers dial the coordinator long before that)."""
        return None if task.plan.waits_for_ready else self.coordinator_port

    def view(self, task: AttemptTask) -> TaskView:
        plan = task.plan
        error = None
        stopped = task.tail_at_stop is not None  # the error file it wrote once continued is no evidence either
        if task.returncode not in (None, 0) and not stopped and self.backend.writes_here(plan):
            error = error_file.read(error_file.file_name(plan.type, plan.index, task.attempt), self.run_dir.fd)
        tail = task.tail_at_stop if stopped else list(task.output.tail)
        return TaskView(plan.name, plan.host, plan.port, plan.waits_for_ready, tail,
                        task.output.log_path, joined=task.joined, coordinator_port=self.dialled_port(task),
                        returncode=task.returncode, ended_at=task.ended_at, bind_failure=task.output.bind_failure,
                        error=error)


class EvidenceAction:
    """What an attempt collects about why it stopped (evidence.py): `collect` it from the attempt."""
    what = "collect evidence"  # said when it fails: "could not <what>: ..."

    def collect(self, attempt: Attempt) -> None:
        raise NotImplementedError
