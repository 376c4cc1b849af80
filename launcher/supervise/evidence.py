"""What an attempt collects about why it stopped, as actions given to it (after orbit's Controller,
which takes its train actions as a list): each is one class with a `collect(attempt)`; adding a
collector is adding one here and naming it in `while_alive` or `after_stop`. A collector that fails
is said once and keeps neither the others nor the stop from happening (Attempt.collect).

On a stall, each remote host is asked first whether it answers (AskHosts: one cut off is judged
lost, and nothing is waited for from its tasks); then py-spy reads every task's stacks, the tasks
going on (SpyStacks); SIGABRT, which makes faulthandler print them and ends the task, goes only to
the tasks py-spy could not read (AskForStacks); before that, each host's `nvidia-smi -q`
(gpu_state.py); once they are stopped, the stall's folder is written (KeepStacks, stall_bundle.py)."""

from __future__ import annotations

import concurrent.futures
import time

from launcher.host import py_spy
from launcher.supervise import flight_recorder, gpu_state, policy, spy_stacks, stacks, stall_bundle
from launcher.supervise.attempt import Attempt, AttemptTask, EvidenceAction, wait_until
from launcher.supervise.status import STALLED, START_TIMEOUT

# After SIGABRT, how long tasks may take to write their stacks and end: ample, since a stalled job's
# tasks may share a loaded machine, and waiting ends as soon as they have.
STACKS_TIMEOUT = 30.0
# How long py-spy may take for one task, all its processes (each has py_spy.DUMP_TIMEOUT), over SSH too.
SPY_TIMEOUT = 60.0
MAX_SPIES_AT_ONCE = 32


def stacks_file_name(attempt: int) -> str:
    return f"stacks-{attempt}.txt"


def bundle_name(attempt: int) -> str:
    return stall_bundle.folder_name(attempt)


def whereabouts(attempt: Attempt) -> dict[str, stacks.Whereabouts | None]:
    """Where each task py-spy read was."""
    return {name: spied.whereabouts() for name, spied in attempt.spied.items() if spied.collected}


def spy(tasks: list[AttemptTask], native: bool, timeout: float = SPY_TIMEOUT) -> dict[str, spy_stacks.TaskStacks]:
    """py-spy's stacks of `tasks`, read on their hosts at once; a task whose reading fails has its
    problem said, never keeping the others from theirs."""
    def one(task: AttemptTask) -> spy_stacks.TaskStacks:
        try:
            answer = task.proc.spy_stacks(native, task.plan, timeout)
        except Exception as e:  # noqa: BLE001 - one host's failure is that task's problem alone
            answer = py_spy.Answer(None, problem=f"{type(e).__name__}: {e}")
        return spy_stacks.read(task.plan.name, task.plan.host, answer)

    if not tasks:
        return {}
    with concurrent.futures.ThreadPoolExecutor(min(len(tasks), MAX_SPIES_AT_ONCE), thread_name_prefix="spy") as pool:
        return {task.plan.name: read for task, read in zip(tasks, pool.map(one, tasks))}


def live(attempt: Attempt, task: str | None, native: bool) -> tuple[str, list[str], list[str]]:
    """`mgpu stacks`' answer (stacks_request.py): the stacks of the running task `task` (None: of
    every one), their text, the tasks read and the problems, one line each."""
    tasks = [t for t in attempt.running() if task is None or t.plan.name == task]
    if not tasks:
        return "", [], [f"{task or 'no task'} is not running (attempt {attempt.number + 1})"]
    found = spy(tasks, native)
    for one in tasks:
        if not found[one.plan.name].collected and one.proc.stopped():
            found[one.plan.name] = spy_stacks.stopped(found[one.plan.name])
    read = [name for name, spied in found.items() if spied.collected]
    problems = [spied.problem for spied in found.values() if spied.problem]
    return spy_stacks.report(list(found.values())), read, problems


class AskHosts(EvidenceAction):
    """Whether each running task's host still answers, all at once, before anything is asked of the
    tasks: a host cut off answers nothing, so its tasks' stacks would be waited for in vain (py-spy's
    and SIGABRT's waits) until its connection's keepalives ran out. One that does not answer is judged
    lost now; its tasks are no longer running, and the stall is charged to it (blame.py)."""
    what = "ask whether the tasks' hosts answer"

    def collect(self, attempt: Attempt) -> None:
        running = attempt.running()
        if not running:
            return
        with concurrent.futures.ThreadPoolExecutor(min(len(running), MAX_SPIES_AT_ONCE),
                                                   thread_name_prefix="ask") as pool:
            answers = list(pool.map(lambda task: task.proc.answers(), running))
        silent = sorted({task.plan.host for task, answered in zip(running, answers) if answered is False})
        if silent:
            attempt.output.notice(f"{', '.join(silent)} not answering: not waiting for the stacks of its tasks")
        attempt.reap()


class SpyStacks(EvidenceAction):
    """py-spy's stacks of every running task, native frames too, the tasks going on: where it reads
    them, no SIGABRT is needed."""
    what = "read the tasks' stacks with py-spy"

    def collect(self, attempt: Attempt) -> None:
        if py_spy.configured() == "":  # MGPU_PY_SPY set empty: SIGABRT alone
            return
        attempt.spied = spy(attempt.running(), native=True)
        by_name = attempt.by_name
        for spied in attempt.spied.values():
            if spied.stopped:  # where the backend does not follow the tasks' state (Slurm), its host said so now
                attempt.note_stopped(by_name[spied.task], True)
            if spied.problem and not spied.collected:
                attempt.output.notice(f"{spied.problem.splitlines()[0]}; asking {spied.task} with SIGABRT")


class NoteJoins(EvidenceAction):
    """At a start timeout, whether each task not ready had joined its cluster, where that is known:
    the report says what each did not do."""
    what = "probe whether the tasks not ready had joined"

    def __init__(self, missing: tuple[str, ...]):
        self.missing = missing

    def collect(self, attempt: Attempt) -> None:
        by_name = attempt.by_name
        for name in self.missing:
            task = by_name[name]
            if task.plan.port is not None:
                task.joined = task.proc.joined(task.plan.port, attempt.dialled_port(task))


class AskForStacks(EvidenceAction):
    """SIGABRT to every task still running whose stacks py-spy did not read: faulthandler
    (PYTHONFAULTHANDLER, set for every task) writes each Python thread's stack into its log, then the
    process ends. Waits, bounded, for them to end, so that the stacks are in the logs. The console is
    spared them: the report sums them up."""
    what = "ask the tasks for their stacks"

    def collect(self, attempt: Attempt) -> None:
        attempt.stacks_asked_at = time.time()  # a task that ended before it ended on its own (the report says so)
        read = {name for name, spied in attempt.spied.items() if spied.collected}
        running = [task for task in attempt.running() if task.plan.name not in read]
        for task in running:
            task.output.mute_console()
            task.proc.dump_stacks()
        wait_until(lambda: all(t.returncode is not None for t in running), STACKS_TIMEOUT,
                   between=attempt.reap)


class KeepStacks(EvidenceAction):
    """The stacks py-spy read, and those each other task printed, in the stall's folder
    (stall-<attempt>/, with its README), and as stacks-<attempt>.txt in the run dir."""
    what = "keep the tasks' stacks"

    def collect(self, attempt: Attempt) -> None:
        text = []
        for task in attempt.tasks:
            spied = attempt.spied.get(task.plan.name)
            if spied is not None and spied.collected:
                text.append(spied.text())
                continue
            dump = stacks.dump_lines([line.text for line in task.output.tail])
            text.append(f"===== {task.plan.name} on {task.plan.host} =====\n")
            if spied is not None and spied.problem:
                text.append(spied.problem + "\n")
            text.extend(line + "\n" for line in dump or ["(no Python stack)"])
        try:
            stall_bundle.write(attempt.run_dir, attempt.number, "".join(text), stacks_file_name(attempt.number))
        except OSError as exc:  # a full disk: the logs may still have them
            attempt.output.notice(f"cannot write the stall's stacks in {attempt.run_dir.path}: {exc.strerror or exc}")


def while_alive(stop: policy.Stop) -> list[EvidenceAction]:
    """What to collect from the tasks before they are stopped, for a stop with this status."""
    if stop.status == START_TIMEOUT:
        return [NoteJoins(stop.missing)]
    if stop.status == STALLED:
        return [AskHosts(), SpyStacks(), flight_recorder.DumpFlightRecorder(), gpu_state.GpuState(), AskForStacks()]
    return []


def after_stop(stop: policy.Stop) -> list[EvidenceAction]:
    """What to collect once the tasks are gone and their output is in."""
    return [flight_recorder.AnalyzeFlightRecorder(), KeepStacks()] if stop.status == STALLED else []
