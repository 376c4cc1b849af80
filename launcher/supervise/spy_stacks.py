"""What py-spy answered for a task (host/py_spy.py), read: each process's threads and frames, the
text kept and shown, and, where it could not attach, one line that says why and what to change.

py-spy's JSON is untrusted (a host's program printed it): its size is bounded before it is parsed,
every field's type is checked, and nothing of it reaches a terminal unescaped. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from launcher.host.py_spy import DUMP_LIMIT, ENV_PY_SPY, NOT_FOUND, TIMED_OUT, Answer, Dump
from launcher.supervise import stacks
from launcher.supervise.console_text import console_safe

MAX_THREADS = 512  # of one process, read
MAX_FRAMES = 256  # of one thread, read
INSTALL = "pip install py-spy (in the tasks' environment or on PATH)"
# py-spy's words where the kernel refused it the process (os error 13 or 1).
_REFUSED = ("Permission denied (os error 13)", "Operation not permitted (os error 1)")
# Where py-spy found no Python in a process: a shell, a launcher's helper; not worth a line.
_NOT_PYTHON = ("Failed to find python version", "Failed to get process executable name")


@dataclasses.dataclass(frozen=True)
class ProcessStacks:
    pid: int
    threads: tuple[tuple[str, stacks.Thread], ...]  # (name, thread), as py-spy listed them


@dataclasses.dataclass(frozen=True)
class TaskStacks:
    """One task's stacks as py-spy read them, or why not."""
    task: str
    host: str
    processes: tuple[ProcessStacks, ...] = ()
    problem: str | None = None  # one line: why there are no stacks (py-spy missing, refused, timed out)
    refused: bool = False  # the host forbade attaching: SIGABRT is the way left
    stopped: bool = False  # a process of the task was stopped (state T or t) as its host answered

    @property
    def collected(self) -> bool:
        return bool(self.processes)

    def whereabouts(self) -> stacks.Whereabouts | None:
        return stacks.whereabouts_of([[thread for _, thread in p.threads] for p in self.processes])

    def text(self) -> str:
        """As kept in the run dir and shown by `mgpu stacks`: innermost frame first."""
        lines = [f"===== {self.task} on {self.host} =====",
                 "(read by py-spy, the task running)" if self.processes else "(not read by py-spy)"]
        if self.problem is not None:
            lines.append(self.problem)
        for process in self.processes:
            lines.append(f"Process {process.pid}")
            for name, thread in process.threads:
                lines.append(f'Thread "{name}"' + (" (main)" if thread.is_main else ""))
                lines.extend(f"    {frame.file}{f':{frame.line}' if frame.line else ''} in {frame.function}"
                             + (" [native]" if frame.native else "") for frame in thread.frames)
        return "\n".join(lines) + "\n"


def _frame(item: object) -> stacks.Frame | None:
    if not isinstance(item, dict):
        return None
    name, file, line = item.get("name"), item.get("filename"), item.get("line")
    if not isinstance(name, str) or not isinstance(file, str) or not isinstance(line, int) or isinstance(line, bool):
        return None
    return stacks.Frame(file[:1024], max(0, line), name[:512], native=item.get("module") is not None)


def read_process(dump: Dump) -> ProcessStacks | None:
    """The threads of py-spy's JSON for one process; None when it is not that."""
    if dump.status != 0 or len(dump.text) >= DUMP_LIMIT:  # cut short: not whole JSON
        return None
    try:
        items = json.loads(dump.text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(items, list):
        return None
    threads = []
    for item in items[:MAX_THREADS]:
        if not isinstance(item, dict) or not isinstance(item.get("frames"), list):
            continue
        name = item.get("thread_name")
        frames = [f for f in map(_frame, item["frames"][:MAX_FRAMES]) if f is not None]
        tid = item.get("os_thread_id")
        name = name[:200] if isinstance(name, str) else f"thread {tid}" if isinstance(tid, int) else "thread"
        python = [f for f in frames if not f.native]
        # The main thread by its name, or by a script's outermost frame.
        main = name == "MainThread" or stacks.Thread(False, tuple(python)).is_main
        threads.append((name, stacks.Thread(False, tuple(frames), main=main)))
    return ProcessStacks(dump.pid, tuple(threads))


def refused_line(task: str, host: str, answer: Answer, dump: Dump) -> str:
    """Why the host let py-spy not attach, and what to change there."""
    why = []
    if answer.uid is not None and dump.owner is not None and answer.uid != dump.owner:
        why.append(f"the process runs as uid {dump.owner}, mgpu as uid {answer.uid}")
    if answer.ptrace_scope:
        why.append(f"kernel.yama.ptrace_scope is {answer.ptrace_scope}")
    elif not why:
        why.append("the container or host denies ptrace")
    return (f"{task} on {host}: py-spy may not attach to pid {dump.pid} ({'; '.join(why)}): run the tasks as "
            f"mgpu's user, set `sysctl kernel.yama.ptrace_scope=0` there, or give the container SYS_PTRACE "
            f"(docker run --cap-add SYS_PTRACE)")


def read(task: str, host: str, answer: Answer | None) -> TaskStacks:
    """A host's answer for a task, read; None: its backend cannot run py-spy beside it."""
    read = _read(task, host, answer)
    return dataclasses.replace(read, stopped=True) if answer is not None and answer.stopped() else read


def _read(task: str, host: str, answer: Answer | None) -> TaskStacks:
    if answer is None:
        return TaskStacks(task, host, problem=f"{task} on {host}: its backend cannot attach py-spy")
    if answer.problem is not None:
        return TaskStacks(task, host, problem=f"{task} on {host}: {console_safe(answer.problem)}")
    if answer.spy is None:
        return TaskStacks(task, host, problem=f"{task} on {host}: no py-spy there ({INSTALL}; or set {ENV_PY_SPY})")
    processes, problems, refused = [], [], False
    for dump in answer.dumps:
        process = read_process(dump)
        if process is not None:
            processes.append(process)
            continue
        if any(words in dump.text for words in _REFUSED):
            refused = True
            problems.append(refused_line(task, host, answer, dump))
        elif dump.status == TIMED_OUT:
            problems.append(f"{task} on {host}: py-spy did not read pid {dump.pid} within its time")
        elif dump.status == NOT_FOUND:
            problems.append(f"{task} on {host}: cannot run py-spy ({console_safe(answer.spy)})")
        elif not any(words in dump.text for words in _NOT_PYTHON):
            first = next((line for line in dump.text.splitlines() if line.strip()), "no answer")
            problems.append(f"{task} on {host}: py-spy could not read pid {dump.pid}: {console_safe(first[:200])}")
    if not processes and not problems:
        problems.append(f"{task} on {host}: no Python process of the task was found running")
    return TaskStacks(task, host, tuple(processes), "\n".join(problems) or None,
                      refused=refused and not processes)


def stopped(spied: TaskStacks) -> TaskStacks:
    """A task seen stopped whose stacks py-spy could not read: py-spy waits on a stopped process
    and gives up, so its own words ("Failed to get stack traces") would hide why."""
    return dataclasses.replace(spied, problem=(
        f"{spied.task} on {spied.host} is stopped (SIGSTOP, or a debugger), and py-spy cannot read a stopped "
        f"process: continue it (kill -CONT), or the stall watchdog takes its stack with SIGABRT after --stall-timeout"))


def report(collected: Sequence[TaskStacks]) -> str:
    """Every task's stacks, one after another, as `mgpu stacks` prints them."""
    return "".join(task.text() for task in collected)
