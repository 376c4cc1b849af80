"""What an attempt collects about why it stopped, as actions given to it (after orbit's Controller,
which takes its train actions as a list): each is one class with a `collect(attempt)`; adding a
collector is adding one here and naming it in `while_alive` or `after_stop`. A collector that fails
is said once and keeps neither the others nor the stop from happening (Attempt.collect)."""

from __future__ import annotations

import time

from launcher.supervise import policy, stacks
from launcher.supervise.attempt import Attempt, EvidenceAction, wait_until
from launcher.supervise.status import STALLED, START_TIMEOUT

# After SIGABRT, how long tasks may take to write their stacks and end: ample, since a stalled job's
# tasks may share a loaded machine, and waiting ends as soon as they have.
STACKS_TIMEOUT = 30.0


def stacks_file_name(attempt: int) -> str:
    return f"stacks-{attempt}.txt"


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
    """SIGABRT to every task still running: faulthandler (PYTHONFAULTHANDLER, set for every task)
    writes each Python thread's stack into its log, then the process ends. Waits, bounded, for them
    to end, so that the stacks are in the logs. The console is spared them: the report sums them up."""
    what = "ask the tasks for their stacks"

    def collect(self, attempt: Attempt) -> None:
        attempt.stacks_asked_at = time.time()  # a task that ended before it ended on its own (the report says so)
        running = attempt.running()
        for task in running:
            task.output.mute_console()
            task.proc.dump_stacks()
        wait_until(lambda: all(t.returncode is not None for t in running), STACKS_TIMEOUT,
                   between=attempt.reap)


class KeepStacks(EvidenceAction):
    """The stacks each task printed, in the run dir: stacks-<attempt>.txt."""
    what = "keep the tasks' stacks"

    def collect(self, attempt: Attempt) -> None:
        text = []
        for task in attempt.tasks:
            dump = stacks.dump_lines([line.text for line in task.output.tail])
            text.append(f"===== {task.plan.name} on {task.plan.host} =====\n")
            text.extend(line + "\n" for line in dump or ["(no Python stack)"])
        name = stacks_file_name(attempt.number)
        try:
            with open(attempt.run_dir.create(name), "w", encoding="utf-8", errors="replace") as f:
                f.writelines(text)
        except OSError as exc:  # a full disk: the logs may still have them
            attempt.output.notice(f"cannot write {name} in {attempt.run_dir.path}: {exc.strerror or exc}")


def while_alive(stop: policy.Stop) -> list[EvidenceAction]:
    """What to collect from the tasks before they are stopped, for a stop with this status."""
    if stop.status == START_TIMEOUT:
        return [NoteJoins(stop.missing)]
    if stop.status == STALLED:
        return [AskForStacks()]
    return []


def after_stop(stop: policy.Stop) -> list[EvidenceAction]:
    """What to collect once the tasks are gone and their output is in."""
    return [KeepStacks()] if stop.status == STALLED else []
