"""Running a preflight command on the host of a task: this machine through /bin/sh, any other
through the SSH backend's connection, always with a time limit, and over many hosts at once.

The checks (check.py) and the reachability test (reach.py) both run their probes this way, so
what "run on a host" means, and how it fails, is written once.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
from typing import Callable, Iterable, Sequence, TypeVar

from launcher.errors import CheckFailed, ConnectError
from launcher.plan.planner import TaskPlan


@dataclasses.dataclass(frozen=True)
class HostOutput:
    code: int
    out: bytes
    err: bytes

    def last_json(self) -> dict | None:
        return last_json(self.out)

    def last_error_line(self) -> str:
        """The last line on stderr, or the exit code when there is none: why a probe did not run."""
        return (self.err.decode("utf-8", "replace").strip().splitlines() or [f"exit code {self.code}"])[-1]


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
            conversation: Conversation | None = None, hold: bool = False) -> HostOutput:
        """`command` (one line for a login shell: see launcher.shell.sh) on `plan`'s host; with
        `conversation`, talked with while it runs (its stdin open), else its stdin at its end. With
        `hold` (a remote host only), a probe that says HELD keeps its session to start `plan`
        (SshBackend.run).

        Raises CheckFailed when it outlives `timeout`, and the SSH backend's errors (ConnectError,
        HostKeyError) when the host cannot be reached."""
        if not plan.local:
            if self._ssh_backend is None:
                raise ConnectError(f"{plan.host}: no SSH backend to reach it")
            return HostOutput(*self._ssh_backend.run(plan, command, timeout, conversation, hold=hold))
        if conversation is not None:
            return _run_here_talking(plan, command, timeout, what, conversation)
        try:
            done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise CheckFailed(f"{plan.host}: the {what} did not finish within {timeout:g} s") from e
        return HostOutput(done.returncode, done.stdout, done.stderr)

    def drop_held(self, plan: TaskPlan) -> None:
        """End the session a `run` with `hold` kept to start `plan`, if any."""
        if not plan.local and self._ssh_backend is not None:
            self._ssh_backend.drop_held([plan])

    def json(self, plan: TaskPlan, command: str, timeout: float, what: str,
             conversation: Conversation | None = None) -> dict:
        """The JSON object that `command` prints last; CheckFailed naming why when there is none."""
        output = self.run(plan, command, timeout, what, conversation)
        result = output.last_json()
        if result is None:
            raise CheckFailed(f"{plan.host}: the {what} did not run: {output.last_error_line()}")
        return result


def _run_here_talking(plan: TaskPlan, command: str, timeout: float, what: str,
                      conversation: Conversation) -> HostOutput:
    """HostShell.run on this machine, with a conversation."""
    proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = bytearray(), bytearray()

    def read_out() -> None:
        for line in iter(proc.stdout.readline, b""):
            out.extend(line)
            if line.endswith(b"\n"):
                conversation.heard(line[:-1])

    def send(data: bytes) -> None:
        proc.stdin.write(data)
        proc.stdin.flush()

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: err.extend(proc.stderr.read()), daemon=True)]
    for reader in readers:
        reader.start()
    conversation.attach(send)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        proc.wait()
        raise CheckFailed(f"{plan.host}: the {what} did not finish within {timeout:g} s") from e
    finally:
        conversation.detach()
        try:
            proc.stdin.close()
        except OSError:
            pass  # the command ended before reading it all
        for reader in readers:
            reader.join(timeout)
        proc.stdout.close()
        proc.stderr.close()
    return HostOutput(proc.returncode, bytes(out), bytes(err))


def last_json(out: bytes) -> dict | None:
    """The last line of `out` that starts with "{", parsed; None when there is none or it is not JSON
    (a login script may print before the probe does)."""
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


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
