"""Running a preflight command on the host of a task: this machine through /bin/sh, any other
through the SSH backend's connection, always with a time limit, and over many hosts at once.

The checks (check.py) and the reachability test (reach.py) both run their probes this way, so
what "run on a host" means, and how it fails, is written once.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypeVar

from launcher.errors import CheckFailed, ConnectError, UnreadableAnswer
from launcher.plan.planner import TaskPlan
from launcher.preflight.answers import OUTPUT_LIMIT, last_json, unreadable
from launcher.supervise.console_text import console_safe

if TYPE_CHECKING:
    from launcher.backends.ssh.handover import Handover


@dataclasses.dataclass(frozen=True)
class HostOutput:
    code: int
    out: bytes
    err: bytes
    handover: Handover | None = None  # the session kept to start the host's first task (`run` with handover)

    def last_json(self) -> dict | None:
        """See answers.last_json: UnreadableAnswer (its reason) for a line that cannot be read."""
        return last_json(self.out)

    def last_error_line(self) -> str:
        """The last line on stderr, or the exit code when there is none: why a probe did not run."""
        line = (self.err.decode("utf-8", "replace").strip().splitlines() or [f"exit code {self.code}"])[-1]
        return console_safe(line[:1000])


class Conversation:
    """Talk with a preflight command while it runs: `heard` gets each line of its stdout (without the
    newline) as it comes, from the thread that reads it; `say` writes to its stdin, which stays open
    until it ends. What is said before the command starts is sent when it does; after it ends, nothing."""

    def __init__(self, heard: Callable[[bytes], None]):
        self.heard = heard
        self._lock = threading.Lock()
        self._send: Callable[[bytes], object] | None = None
        self._early = bytearray()  # said before the command started
        self._ended = False

    def attach(self, send: Callable[[bytes], object]) -> None:
        """The command has started; `send` writes to its stdin."""
        with self._lock:
            if self._ended:
                return
            self._send = send
            early, self._early = bytes(self._early), bytearray()
            if early:
                self._deliver(early)

    def say(self, data: bytes) -> None:
        with self._lock:
            if self._ended:
                return
            if self._send is None:
                self._early += data
            else:
                self._deliver(data)

    def detach(self) -> None:
        """The command has ended (or never started): nothing more reaches it."""
        with self._lock:
            self._ended = True
            self._send = None

    def _deliver(self, data: bytes) -> None:
        try:
            self._send(data)
        except Exception:  # noqa: BLE001 - a command that has just ended hears nothing more, which is all this means
            self._send = None


class HostShell:
    """Runs a /bin/sh command line on the host of a plan; `ssh_backend` (a backends.ssh.SshBackend)
    reaches remote hosts, and a run without one can only reach this machine."""

    def __init__(self, ssh_backend=None):
        self._ssh_backend = ssh_backend

    def connect(self, plan: TaskPlan) -> None:
        """Open the connection to `plan`'s host now, if it is remote: its commands then start at once.
        Raises the SSH backend's errors as `run` does."""
        if plan.local:
            return
        if self._ssh_backend is None:
            raise ConnectError(f"{plan.host}: no SSH backend to reach it")
        self._ssh_backend.connect(plan).release()

    def run(self, plan: TaskPlan, command: str, timeout: float, what: str = "check",
            conversation: Conversation | None = None, handover: bool = False) -> HostOutput:
        """`command` (one line for a login shell: see launcher.shell.sh) on `plan`'s host; with
        `conversation`, talked with while it runs (its stdin open), else its stdin at its end. With
        `handover` (a remote host only), a command of backends/ssh/handover.py that hands its session
        over comes back with the Handover that starts `plan` (SshBackend.run_for_handover).

        Raises CheckFailed when it outlives `timeout`, UnreadableAnswer when it writes more than
        OUTPUT_LIMIT bytes on stdout or stderr, and the SSH backend's errors (ConnectError,
        HostKeyError) when the host cannot be reached."""
        if plan.local:
            return _run_here(plan, command, timeout, what, conversation)
        if self._ssh_backend is None:
            raise ConnectError(f"{plan.host}: no SSH backend to reach it")
        try:
            if handover:
                return HostOutput(*self._ssh_backend.run_for_handover(plan, command, timeout, conversation,
                                                                      limit=OUTPUT_LIMIT))
            return HostOutput(*self._ssh_backend.run(plan, command, timeout, conversation, limit=OUTPUT_LIMIT))
        except UnreadableAnswer as e:  # its reason: the host is named here
            raise unreadable(plan.host, what, str(e)) from None

    def json(self, plan: TaskPlan, command: str, timeout: float, what: str,
             conversation: Conversation | None = None) -> dict:
        """The JSON object that `command` prints last; CheckFailed naming why when there is none."""
        output = self.run(plan, command, timeout, what, conversation)
        try:
            result = output.last_json()
        except UnreadableAnswer as e:
            raise unreadable(plan.host, what, str(e)) from None
        if result is None:
            raise CheckFailed(f"{plan.host}: the {what} did not run: {output.last_error_line()}")
        return result


def _run_here(plan: TaskPlan, command: str, timeout: float, what: str,
              conversation: Conversation | None) -> HostOutput:
    """HostShell.run on this machine: stdin at its end, or open for `conversation`; each stream read
    in chunks, up to OUTPUT_LIMIT bytes, past which the command is stopped."""
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL if conversation is None else subprocess.PIPE)
    out, err = bytearray(), bytearray()
    too_long: list[str] = []

    def read(stream, into: bytearray, name: str, heard: Callable[[bytes], None] | None) -> None:
        told = 0  # how much of `into` has been heard: whole lines only
        while chunk := os.read(stream.fileno(), 65536):
            if len(into) + len(chunk) > OUTPUT_LIMIT:
                too_long.append(f"more than {OUTPUT_LIMIT >> 20} MiB on {name}")
                _kill_tree(proc)
                return
            into.extend(chunk)
            while heard is not None and (end := into.find(b"\n", told)) >= 0:
                heard(bytes(into[told:end]))
                told = end + 1

    def send(data: bytes) -> None:
        proc.stdin.write(data)
        proc.stdin.flush()

    readers = [threading.Thread(target=read, args=(proc.stdout, out, "stdout", conversation and conversation.heard),
                                daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, "stderr", None), daemon=True)]
    for reader in readers:
        reader.start()
    if conversation is not None:
        conversation.attach(send)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired as e:
        _kill_tree(proc)
        raise CheckFailed(f"{plan.host}: the {what} did not finish within {timeout:g} s") from e
    finally:
        if conversation is not None:
            conversation.detach()
            try:
                proc.stdin.close()
            except OSError:
                pass  # the command ended before reading it all
        for reader in readers:  # a child that keeps the pipes open is not waited for beyond the timeout
            reader.join(timeout)
        proc.stdout.close()
        proc.stderr.close()
    if too_long:
        raise unreadable(plan.host, what, too_long[0])
    return HostOutput(proc.returncode, bytes(out), bytes(err))


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill a command run here and what it started: a child left behind would hold its pipes open."""
    import psutil  # here: a check that goes well never needs it

    from launcher.host.proctree import descendants, send

    try:
        tree = descendants(psutil.Process(proc.pid))
    except psutil.Error:
        tree = []
    proc.kill()
    send(tree, signal.SIGKILL)
    proc.wait()


def by_host(plans: Iterable[TaskPlan]) -> list[list[TaskPlan]]:
    """`plans` grouped by the host they run on, in plan order: each group is probed once. A host
    name that means this machine for some tasks and a remote host for others is two hosts."""
    groups: dict[tuple[str, bool], list[TaskPlan]] = {}
    for plan in plans:
        groups.setdefault((plan.host, plan.local), []).append(plan)
    return list(groups.values())


T = TypeVar("T")


# How often the waiting main thread looks for Ctrl-C. The kernel may hand SIGINT to any thread (to
# another one whenever the main thread already has a signal pending); Python then runs its handler
# only when the main thread runs again, which an unbounded join would not let it do.
INTERRUPT_CHECK = 0.2


def in_parallel(jobs: Sequence[Callable[[], T]], limit: int) -> list[T]:
    """Run `jobs`, up to `limit` at once; their results in order, or the first job's error.

    The threads are daemons: an interrupt (Ctrl-C) returns at once instead of
    waiting out every probe's timeout, as leaving a ThreadPoolExecutor would,
    and interpreter exit does not wait for them either.
    """
    results: list = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)
    pending = iter(range(len(jobs)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                results[i] = jobs[i]()
            except BaseException as e:  # re-raised in the caller's thread
                errors[i] = e

    threads = [threading.Thread(target=work, daemon=True, name="mgpu-check") for _ in range(min(limit, len(jobs)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(INTERRUPT_CHECK)
    for error in errors:
        if error is not None:
            raise error
    return results
