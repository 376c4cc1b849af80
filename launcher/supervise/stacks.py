"""Python stacks in a task's output, and where each stalled task is.

When a run stalls, the supervisor sends SIGABRT to every task. Each Python process of a task has
faulthandler on (PYTHONFAULTHANDLER, set in every task's environment), which writes the stack of
every thread to stderr before the process dies:

    Fatal Python error: Aborted

    Thread 0x00007f... (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 324 in wait
      ...
    Current thread 0x00007f... (most recent call first):
      File "train.py", line 22 in next_batch
      File "train.py", line 41 in <module>

The main thread tells where a task is: inside the framework (TensorFlow, JAX, PyTorch: most likely
waiting in a collective for a peer), in another installed package (Lightning, say), or in the
program's own code (the likely cause of a stall that leaves the others waiting). A task is said to
be in its own code only where a frame of its own shows it. Pure text work, no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

_DUMP_START = "Fatal Python error:"
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+(?: \[[^\]]*\])? \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.+)$')
# Frames of these packages are the framework's: a main thread there waits in the framework.
_FRAMEWORK = re.compile(
    r"[/\\](?:site|dist)-packages[/\\](?P<name>tensorflow|tf_keras|keras|jax|jaxlib|torch|horovod)[/\\]"
)
# Any other installed package: its name, the folder under site-packages.
_PACKAGE = re.compile(r"[/\\](?:site|dist)-packages[/\\](?P<name>[A-Za-z0-9_.-]+?)(?:\.py)?(?:[/\\]|$)")
# The standard library: a thread waits in it for something the calling frame asked for.
_STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\](?!(?:site|dist)-packages)|^<frozen ")
SHOWN_FRAMES = 6


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    native: bool = False  # a C or C++ frame (py-spy --native): its file is the library's

    def __str__(self) -> str:
        return f"{short_path(self.file)}{f':{self.line}' if self.line else ''} in {self.function}"


@dataclasses.dataclass(frozen=True)
class Thread:
    current: bool  # the thread that handled the signal
    frames: tuple[Frame, ...]  # innermost first, as faulthandler prints them
    main: bool = False  # known to be the main thread (py-spy names it)

    @property
    def is_main(self) -> bool:
        """The program's main thread: known so, or its outermost frame is a script's or `python -m`'s."""
        python = [f for f in self.frames if not f.native]
        return self.main or bool(python) and (python[-1].function == "<module>"
                                              or python[-1].function == "_run_module_as_main")


@dataclasses.dataclass(frozen=True)
class Whereabouts:
    """Where a task's main thread was when it was asked for its stacks."""

    framework: str | None  # the framework or package it waits in; None: in the program's own code
    frames: tuple[Frame, ...]  # innermost first

    @property
    def in_own_code(self) -> bool:
        return self.framework is None


def is_library(path: str) -> bool:
    """A frame of the standard library or of an installed package, not the program's own."""
    return bool(_STDLIB.search(path) or re.search(r"[/\\](?:site|dist)-packages[/\\]", path))


def short_path(path: str) -> str:
    """A frame's file without the install prefix of packages."""
    match = re.search(r"[/\\](?:site|dist)-packages[/\\]", path)
    return path[match.end():] if match else path


def dumps(lines: Sequence[str]) -> list[list[Thread]]:
    """Every faulthandler dump in `lines` (one per Python process that wrote one), in order."""
    found: list[list[Thread]] = []
    threads: list[Thread] | None = None
    current: bool | None = None
    frames: list[Frame] = []

    def end_thread() -> None:
        nonlocal current, frames
        if threads is not None and current is not None:
            threads.append(Thread(current, tuple(frames)))
        current, frames = None, []

    for line in lines:
        if line.startswith(_DUMP_START):
            end_thread()
            threads = []
            found.append(threads)
            continue
        if threads is None:
            continue
        thread = _THREAD.match(line)
        frame = _FRAME.match(line) if thread is None else None
        if thread is not None:
            end_thread()
            current = thread["current"] == "Current thread"
        elif frame is not None and current is not None:
            frames.append(Frame(frame["file"], int(frame["line"]), frame["function"]))
        elif line.strip() and not line.startswith("  "):  # the dump is over (or another line came between)
            end_thread()
    end_thread()
    return [dump for dump in found if dump]


def main_thread(threads: Sequence[Thread]) -> Thread | None:
    """The main thread of one dump; else the thread that handled the signal; else the first."""
    for thread in threads:
        if thread.is_main:
            return thread
    for thread in threads:
        if thread.current:
            return thread
    return threads[0] if threads else None


def whereabouts(lines: Sequence[str]) -> Whereabouts | None:
    """Where the task was, from its output's last dump with a main thread; None without a dump."""
    return whereabouts_of(dumps(lines))


def whereabouts_of(found: Sequence[Sequence[Thread]]) -> Whereabouts | None:
    """Where the task was, from the last of its processes' dumps with a main thread. Native frames
    (py-spy's) count only where they are the framework's own libraries: a libc or libpython frame
    waits on behalf of the Python frame that called it."""
    candidates = [main_thread(threads) for threads in found]
    candidates = [t for t in candidates if t is not None]
    mains = [t for t in candidates if t.is_main and t.frames] or [t for t in candidates if t.frames]
    if not mains:
        return None
    thread = mains[-1]
    for frame in thread.frames:  # innermost first: the standard library waits on behalf of its caller
        if _STDLIB.search(frame.file) or frame.native and not _FRAMEWORK.search(frame.file):
            continue
        match = _FRAMEWORK.search(frame.file) or _PACKAGE.search(frame.file)
        return Whereabouts(match["name"] if match else None, thread.frames)
    return Whereabouts("Python's standard library", thread.frames)


def dump_lines(lines: Sequence[str]) -> list[str]:
    """The lines of every dump in `lines`, for the stacks file."""
    kept: list[str] = []
    inside = False
    for line in lines:
        if line.startswith(_DUMP_START):
            inside = True
        elif inside and line.strip() and not (line.startswith("  ") or _THREAD.match(line)
                                                or line.startswith("Extension modules:")):
            inside = False
        if inside:
            kept.append(line)
    return kept
