"""`mgpu stacks RUN`: the stacks of a live run's tasks, read by py-spy on their hosts, the run going on.

The supervisor holds every host's connection and knows where each task's processes are, so it is
the one that reads them: `mgpu stacks` leaves a request in the run's folder
(stacks-request-<stamp>.json), the supervisor sees it at its next look (every LOOK_INTERVAL), has
py-spy read the tasks asked for, all at once, from a thread of its own (its loop goes on), and
writes stacks-<stamp>.txt (kept: every task's stacks, or the line that says why not) and then
stacks-<stamp>.done (which tasks were read, and the problems), which `mgpu stacks` waits for.
A request is read as untrusted: bounded, its shape checked; one it cannot read is dropped.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Callable, Sequence

from launcher.supervise.rundir import RunDir

LOOK_INTERVAL = 0.5  # seconds between the supervisor's looks for a request
REQUEST_LIMIT = 4096  # bytes of a request read
_REQUEST = re.compile(r"^stacks-request-(?P<stamp>\d{8}-\d{6}-[0-9a-f]{8})\.json$")


def request_name(stamp: str) -> str:
    return f"stacks-request-{stamp}.json"


def stacks_name(stamp: str) -> str:
    return f"stacks-{stamp}.txt"


def done_name(stamp: str) -> str:
    return f"stacks-{stamp}.done"


def new_stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(4).hex()


def write_request(folder: str | os.PathLike, stamp: str, task: str | None, native: bool) -> None:
    """The request, made whole under a temporary name and then renamed: the supervisor never reads half of one."""
    temporary = os.path.join(folder, f".{request_name(stamp)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump({"task": task, "native": native}, f)
    os.replace(temporary, os.path.join(folder, request_name(stamp)))


def _read_request(run_dir: RunDir, name: str) -> tuple[str | None, bool] | None:
    """(task or None for all, native) of a request; None for one that is not a request."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=run_dir.fd)
    except OSError:
        return None
    try:
        data = os.read(fd, REQUEST_LIMIT + 1)
    finally:
        os.close(fd)
    try:
        asked = json.loads(data) if len(data) <= REQUEST_LIMIT else None
    except ValueError:
        return None
    if not isinstance(asked, dict) or not isinstance(asked.get("native"), bool):
        return None
    task = asked.get("task")
    return (task, asked["native"]) if task is None or isinstance(task, str) else None


class Requests:
    """The supervisor's side: looks for requests, answers each from a thread of its own, one at a time.
    `answer(task or None, native)` returns (the stacks' text, tasks read, problems)."""

    def __init__(self, run_dir: RunDir, notice: Callable[[str], None]):
        self.run_dir = run_dir
        self.notice = notice
        self._next_look = 0.0
        self._busy: threading.Thread | None = None

    def look(self, answer: Callable[[str | None, bool], tuple[str, Sequence[str], Sequence[str]]]) -> None:
        now = time.monotonic()
        if now < self._next_look or (self._busy is not None and self._busy.is_alive()):
            return
        self._next_look = now + LOOK_INTERVAL
        try:
            names = sorted(n for n in os.listdir(self.run_dir.fd) if _REQUEST.match(n))
        except OSError:
            return
        if not names:
            return
        name = names[0]
        asked = _read_request(self.run_dir, name)
        self.run_dir.unlink(name)
        if asked is None:
            return
        stamp = _REQUEST.match(name)["stamp"]
        self._busy = threading.Thread(target=self._answer, args=(stamp, asked, answer), name="stacks", daemon=True)
        self._busy.start()

    def _answer(self, stamp: str, asked: tuple[str | None, bool], answer) -> None:
        try:
            text, read, problems = answer(*asked)
        except Exception as e:  # noqa: BLE001 - said in the answer; the run goes on
            text, read, problems = "", [], [f"could not read the stacks: {type(e).__name__}: {e}"]
        try:
            self._write(stacks_name(stamp), text)
            self._write(done_name(stamp), json.dumps({"read": list(read), "problems": list(problems)}))
        except OSError as e:
            self.notice(f"cannot write {stacks_name(stamp)} in {self.run_dir.path}: {e.strerror or e}")
            return
        self.notice(f"stacks asked for by `mgpu stacks`: {self.run_dir / stacks_name(stamp)}")

    def _write(self, name: str, text: str) -> None:
        temporary = f".{name}.tmp"
        with open(self.run_dir.create(temporary), "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
        self.run_dir.replace(temporary, name)
