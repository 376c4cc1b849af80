"""Word when something happens: `--notify CMD` and `--notify-url URL`.

The supervisor hands its events to a Notifier: the run started, an attempt failed (its cause, task
and host), a host was left out or taken back, the run's size changed (`--min-hosts`: from how many
hosts to how many, and why), the run stalled, the run ended (its status and goodput). Each event
is one JSON object; the command gets it on its standard input and in MGPU_EVENT, the URL gets it as
the body of a POST, with a `text` field that Slack's incoming webhooks (and Mattermost's, Teams'
workflows, Discord's /slack endpoint) show as the message.

Supervision never waits on a notice: events go to a bounded queue that one thread empties, each
notice bounded in time (NOTICE_TIMEOUT; a command still running then is killed with its process
group). An event that finds the queue full is dropped and counted. The first notice that fails is
said on the console, once; if any failed or were dropped, the counts are said at the end and kept
in run.json's warnings. At the end of the run the notices still queued have CLOSE_TIMEOUT to go.

What a notice carries is chosen here, field by field: names, counts, causes and the first line of
a failure, never an environment variable's value or a command line; texts from programs are cut to
MAX_TEXT characters, and in `text` the characters Slack reads as markup (& < >) are escaped, so
that a program's output cannot mention @channel or a user.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.client
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Protocol, Sequence
from urllib.parse import urlsplit

from launcher.supervise import causes
from launcher.supervise.console_text import console_safe


class SizeChanged(Protocol):
    """What a notice says of the run's size changing (sizes.SizeChange has it)."""
    hosts_from: int
    hosts_to: int
    planned: int
    tasks_from: int
    tasks_to: int
    dropped: Sequence[str]
    back: Sequence[str]
    why: str

RUN_STARTED = "run-started"
ATTEMPT_FAILED = "attempt-failed"
HOST_LEFT_OUT = "host-left-out"
HOST_TAKEN_BACK = "host-taken-back"
SIZE_CHANGED = "size-changed"
STALLED = "stalled"
RUN_ENDED = "run-ended"
EVENTS = (RUN_STARTED, ATTEMPT_FAILED, HOST_LEFT_OUT, HOST_TAKEN_BACK, SIZE_CHANGED, STALLED, RUN_ENDED)

ENV_EVENT = "MGPU_EVENT"  # the event's JSON, for a command that does not read its standard input
NOTICE_TIMEOUT = 10.0  # seconds for one notice: a command to end, a POST to be answered
CLOSE_TIMEOUT = 15.0  # seconds at the run's end for the notices still queued
QUEUE_SIZE = 64  # events waiting; one more is dropped (and counted)
MAX_TEXT = 300  # characters of any text taken from a program or a host
MAX_HOSTS = 64  # hosts named in run-started (Linux takes at most 128 KiB in one environment variable)
MAX_ANSWER = 4096  # bytes read of a URL's answer, or of a command's error output
KILL_WAIT = 2.0  # seconds for a command killed at its timeout to be gone


def check_url(text: str) -> str:
    """A URL --notify-url can post to: http or https, with a host; ValueError otherwise."""
    if not text.isprintable() or any(c.isspace() for c in text):
        raise ValueError("the URL has spaces or control characters")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("give an http:// or https:// URL with a host")
    return text


def _cut(text: object) -> str:
    """A text from a program or a host, on one line and at most MAX_TEXT characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_TEXT else line[:MAX_TEXT - 1] + "…"


def _counted(number: int, thing: str) -> str:
    return f"{number} {thing}" if number == 1 else f"{number} {thing}s"


def _slack_safe(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class Counts:
    sent: int = 0
    failed: int = 0
    dropped: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Notifier:
    """The run's notices. Without a command or a URL it does nothing (and starts no thread)."""

    def __init__(self, run_id: str, command: str | None = None, url: str | None = None,
                 report: Callable[[str], None] = lambda text: None, timeout: float = NOTICE_TIMEOUT,
                 queue_size: int = QUEUE_SIZE):
        self.run_id = run_id
        self.command = command
        self.url = url
        self.timeout = timeout
        self.queue_size = queue_size
        self.counts = Counts()
        self._report = report  # gets the first failure, once
        self._queue: queue.Queue = queue.Queue()  # bounded by _event: QUEUE_SIZE events, and close's end mark
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running: subprocess.Popen | None = None
        self._closed = False
        self._abandoned = False  # closed while a notice was still going: the thread sends no more
        self._said_failure = False

    @property
    def active(self) -> bool:
        return bool(self.command or self.url)

    # -- the events, as the supervisor names them ---------------------------------------------

    def run_started(self, tasks: int, hosts: list[str], detached: bool) -> None:
        """`hosts`: the first MAX_HOSTS of them, so that the event fits in one environment variable."""
        self._event(RUN_STARTED, f"run {self.run_id} started: {_counted(tasks, 'task')} on {_counted(len(hosts), 'host')}",
                    tasks=tasks, hosts=[_cut(host) for host in hosts[:MAX_HOSTS]], host_count=len(hosts),
                    detached=detached)

    def attempt_failed(self, attempt: int, cause) -> None:
        """A failed attempt's cause (causes.Cause); a stall is told as its own event."""
        fields = {"attempt": attempt, "cause": cause.kind, "task": cause.task,
                  "host": _cut(cause.host) if cause.host else None, "detail": _cut(cause.detail)}
        if cause.rule is not None:
            fields["rule"] = cause.rule.to_dict()
        on = f" ({cause.task} on {fields['host']})" if cause.task else ""
        kind = STALLED if cause.kind == causes.STALLED else ATTEMPT_FAILED
        self._event(kind, f"run {self.run_id}: attempt {attempt} failed: {cause.kind}{on}: {fields['detail']}", **fields)

    def host_left_out(self, host: str, why: str, spare: str | None, goes_on: bool = False) -> None:
        """`spare`: the host that takes its tasks; without one the run stops, or (`goes_on`,
        --min-hosts) goes on without them."""
        then = (f"{spare} takes its tasks" if spare else
                "no spare left: the run goes on without it" if goes_on else "no spare left: the run stops")
        self._event(HOST_LEFT_OUT, f"run {self.run_id}: {_cut(host)} left out ({_cut(why)}); {then}",
                    host=_cut(host), why=_cut(why), spare=spare, goes_on=bool(spare) or goes_on)

    def host_taken_back(self, host: str) -> None:
        """A host the run went on without answered again, passed its checks and has its tasks back."""
        self._event(HOST_TAKEN_BACK, f"run {self.run_id}: {_cut(host)} taken back", host=_cut(host))

    def size_changed(self, change: SizeChanged) -> None:
        """The run goes on on another number of hosts (sizes.SizeChange): from, to, of the planned, and why."""
        said = (f"{', '.join(map(_cut, change.back))} taken back" if change.back else
                f"without {', '.join(map(_cut, change.dropped))} ({_cut(change.why)})")
        self._event(SIZE_CHANGED, f"run {self.run_id}: now on {change.hosts_to} of {change.planned} hosts, "
                                  f"from {change.hosts_from}: {said}",
                    hosts_from=change.hosts_from, hosts_to=change.hosts_to, planned=change.planned,
                    tasks_from=change.tasks_from, tasks_to=change.tasks_to, dropped=[_cut(h) for h in change.dropped],
                    back=[_cut(h) for h in change.back], why=_cut(change.why))

    def run_ended(self, status: str, exit_code: int, message: str | None, costs: dict) -> None:
        goodput = costs.get("goodput")
        said = f"; goodput {goodput:.0%}" if isinstance(goodput, (int, float)) else ""
        first = _cut(message.splitlines()[0]) if message else None
        self._event(RUN_ENDED, f"run {self.run_id} {status} (exit code {exit_code}){said}" + (f": {first}" if first else ""),
                    status=status, exit_code=exit_code, message=first, goodput=goodput,
                    restarts=costs.get("restarts"), wall_s=costs.get("wall_s"))

    def finish(self, status: str, message: str | None, exit_code: int, costs: dict) -> str | None:
        """The run-ended notice, then close: a line to say (and keep) if notices failed or were dropped."""
        self.run_ended(status, exit_code, message, costs)
        counts = self.close()
        if not (counts.failed or counts.dropped):
            return None
        return (f"notices: {counts.sent} sent, {counts.failed} failed, {counts.dropped} dropped "
                f"(a queue of {self.queue_size}, {self.timeout:g} s each)")

    # -- the queue and its thread --------------------------------------------------------------

    def _event(self, kind: str, text: str, **fields: Any) -> None:
        if not self.active or self._closed:
            return
        event = {"event": kind, "run_id": self.run_id, "at": _utc(), **fields, "text": _slack_safe(text)}
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._send_all, name="mgpu-notify", daemon=True)
                self._thread.start()
            if self._queue.qsize() >= self.queue_size:
                self.counts.dropped += 1
            else:
                self._queue.put_nowait(event)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> Counts:
        """Let the notices still queued go, for at most `timeout` seconds; the counts."""
        self._closed = True
        if self._thread is None:
            return self.counts
        deadline = time.monotonic() + timeout
        self._queue.put_nowait(None)  # the thread's last item
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            running, left = self._running, self._thread.is_alive()
        if left:  # what is still queued is dropped; a command still running is stopped
            self._abandoned = True
            if running is not None:
                _kill(running)
            with self._lock:
                self.counts.dropped += max(0, self._queue.qsize() - 1)
        return self.counts

    def _send_all(self) -> None:
        while True:
            event = self._queue.get()
            if event is None or self._abandoned:
                return
            body = json.dumps(event, ensure_ascii=True)
            failures = [why for why in (self._run_command(body) if self.command else None,
                                        self._post(body) if self.url else None) if why]
            with self._lock:
                if failures:
                    self.counts.failed += 1
                else:
                    self.counts.sent += 1
                first = failures and not self._said_failure
                self._said_failure = self._said_failure or bool(failures)
            if first:  # what a command printed or a server answered, said escaped
                self._report(f"a notice failed ({event['event']}): {console_safe(failures[0])}; "
                             f"the failures are counted, and said again at the end")

    def _run_command(self, body: str) -> str | None:
        """Run the command with the event on its standard input and in MGPU_EVENT; why it failed, or None."""
        with tempfile.TemporaryFile() as errors:
            try:
                process = subprocess.Popen(["/bin/sh", "-c", self.command], stdin=subprocess.PIPE,
                                           stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True,
                                           env={**os.environ, ENV_EVENT: body})
            except OSError as e:
                return f"the command could not start: {_cut(e)}"
            with self._lock:
                self._running = process
            try:
                try:
                    process.communicate(body.encode(), timeout=self.timeout)
                except subprocess.TimeoutExpired:
                    _kill(process)
                    return f"the command took over {self.timeout:g} s and was stopped"
                except OSError:  # it did not read its input: that is its own business
                    process.wait(self.timeout)
            except subprocess.TimeoutExpired:
                _kill(process)
                return f"the command took over {self.timeout:g} s and was stopped"
            finally:
                with self._lock:
                    self._running = None
            if process.returncode != 0:
                errors.seek(0)
                said = errors.read(MAX_ANSWER).decode("utf-8", "replace").strip().splitlines()
                last = f": {_cut(said[-1])}" if said else ""
                return f"the command exited with code {process.returncode}{last}"
        return None

    def _post(self, body: str) -> str | None:
        """POST the event to the URL; why it failed, or None. The socket's timeout bounds each read,
        not the whole answer (a server may trickle it): the POST runs in a thread of its own,
        waited for NOTICE_TIMEOUT and then left to its socket's timeout."""
        outcome: list[str | None] = []
        poster = threading.Thread(target=lambda: outcome.append(_post(self.url, body, self.timeout)),
                                  name="mgpu-notify-post", daemon=True)
        poster.start()
        poster.join(self.timeout)
        if not outcome:
            return f"the URL gave no answer in {self.timeout:g} s"
        return outcome[0]


def _post(url: str, body: str, timeout: float) -> str | None:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "mgpu"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read(MAX_ANSWER)
    except urllib.error.HTTPError as e:
        return f"the URL answered HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        return f"the URL could not be reached: {_cut(reason)}"
    return None


def _kill(process: subprocess.Popen) -> None:
    """Stop the command and whatever it started (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(KILL_WAIT)
    except subprocess.TimeoutExpired:
        pass
