"""What task output means: the one place the supervisor learns TensorFlow's log wording.

- bind_failure(): a line saying the task's port could not be bound.
- meaningful(): a task's lines without TensorFlow's C++ start-up noise (cuInit
  without a GPU, the absl preamble, oneDNN and CPU-feature notices, INFO and
  WARNING records). Summaries leave it out, and so does the console unless
  asked (`--show-tf-logs`); log files keep every line.
- cause(): the lines that say why a task failed: what it wrote to its error
  file (launcher/error_file.py), else the last Python exception
  (type, message, and the deepest frame outside libraries), else the first
  error line, else the last meaningful lines. Tracebacks are read from stderr
  alone when it has one: lines of the two streams arrive interleaved, and a
  stdout line inside a traceback is not its exception. PyTorch's "[rankN]: "
  before each line is read through, here and by known_failures().
- blame(): which task is at fault when one fails: the task it reports
  unhealthy, else the coordination service's task if it stopped answering,
  else a peer that failed before it, else itself.
- known_failures(): which known failures a task's lines show (fixes.py says what to
  do about each).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, NamedTuple, Sequence

from launcher.error_file import TaskError

# What TensorFlow's gRPC server prints when its port is taken (TF 2.21), and the
# classic wording of older releases and other servers.
_NO_ADDRESS = re.compile(r"No address added out of total [0-9]+ resolved for '[^']{0,1000}?:([0-9]+)'")
# PyTorch's TCPStore (MASTER_PORT; torch 2.x): "The server socket has failed to listen on any local
# network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use".
_TORCH_NO_LISTEN = re.compile(r"failed to listen on any local network address\. port: ([0-9]+)\b.{0,200}EADDRINUSE")
MAX_PORT = 65535
_BIND_FAILURE = re.compile(r"(?i:address already in use)|EADDRINUSE|Failed to bind|Could not start gRPC server")

# A C++ log record: absl style "I1123 12:00:05.123 1234 file.cc:12] text" (TF 2.21 writes
# "I0000 00:00:1795436902.221261" before absl's clock is set up),
# or the older "2024-01-01 12:00:00.123456: W tensorflow/core/....cc:12] text".
_CPP_RECORD = re.compile(
    r"^(?:(?P<level>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<old_level>[IWEF]) \S+:\d+\])"
)
# Error records TensorFlow prints on every machine without a GPU or with duplicate plugins, and
# its shutdown chatter when a peer (or the coordination service's host) finished first.
_CPP_ERROR_NOISE = re.compile(
    r"failed call to cuInit|StartAbort|Failed to send RPC to coordination service|Unable to register cu(?:DNN|FFT|BLAS) factory|computation placer already registered"
    r"|TF-TRT Warning|Could not find cuda drivers|cuda_executor|kernel driver does not appear to be running"
    r"|oneDNN supports DT_HALF only on platforms with AVX-512"
)
# Plain lines of the same start-up notices (continuations of a record, or Python-side warnings).
_PLAIN_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|^To enable the following instructions:|^This TensorFlow binary is optimized"
    r"|oneDNN custom operations are on"
)
# Lines of a record that spans several lines (e.g. "Example stragglers:" and the task names below it).
_CONTINUATION = re.compile(r"^/job:\S+$")
# A record whose message ends where a protocol buffer's text begins, on the lines below it: with
# protobuf's marker of a debug string, drawn at random from goo.gle/debugstr, /debugonly and
# /debugproto (TF 2.21's eager service in every worker and parameter server of parameter-server
# training: "SessionOptions: goo.gle/debugonly", then 60-odd lines of its ConfigProto and a blank
# line), or with the text's first message opened on the record's own line.
_DUMP_START = re.compile(r"(?:goo\.gle/debug[a-z]*|\{)\s*$")
# A line of that text: a field and its value, a message opened ("gpu_options {"), or closed.
_DUMP_LINE = re.compile(r"^(?:(?:[A-Za-z_]\w*|\[[\w./]+\])(?:: \S.*|:? ?(?P<open>\{))|(?P<close>\}))$")

# What torch.distributed puts before every line of an uncaught exception's report once
# init_process_group has run (its excepthook, torch 2.2 and later): "[rank1]: Traceback ...".
_RANK_PREFIX = re.compile(r"^\[rank[0-9]{1,9}\]: ")

_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python\d|^<frozen |^<string>$")
_ERROR_LINE = re.compile(r"\b(?:[A-Za-z]*Error|ERROR|[A-Za-z]*Exception|FATAL|Fatal|fatal|Traceback)\b|^error:")
MAX_LINE = 400  # longer cause lines are cut

# TensorFlow's coordination service names the tasks whose heartbeats stopped: TF 2.21 on the lines
# after this one ("/job:worker/replica:0/task:1"), older releases in "Task /job:... heartbeat timeout".
_UNHEALTHY = "The following tasks are unhealthy (stopped sending heartbeats):"
_HEARTBEAT_TIMEOUT = re.compile(r"/job:(?P<job>\w+)/replica:\d+/task:(?P<task>\d+) heartbeat timeout")
_TASK_NAME = re.compile(r"^/job:(?P<job>\w+)/replica:\d+/task:(?P<task>\d+)$")
# A task's own heartbeat to the coordination service went unanswered (TF 2.21: a DEADLINE_EXCEEDED
# record, then this line). Not "... while calling /tensorflow.CoordinationService/Heartbeat:" with
# "Connection refused": then the service's task is gone, not frozen.
_LEADER_HEARTBEAT = re.compile(r"^RPC: /tensorflow\.CoordinationService/Heartbeat$")


class TaskLine(NamedTuple):
    """A line of a task's output and the stream it came on."""

    text: str
    stderr: bool


def bind_failure(line: str) -> int | None:
    """The port a line of task output says could not be bound: its number, or 0
    when the line reports a bind failure without naming the port; None otherwise."""
    match = _NO_ADDRESS.search(line) or _TORCH_NO_LISTEN.search(line)
    if match:  # a number that is no port (e.g. thousands of digits, past int()'s limit) names none
        digits = match.group(1)
        return int(digits) if len(digits) <= 5 and int(digits) <= MAX_PORT else 0
    if _BIND_FAILURE.search(line):
        return 0
    return None


def without_rank_prefix(line: str) -> str:
    """`line` without PyTorch's "[rankN]: " prefix, where it has one."""
    return _RANK_PREFIX.sub("", line, count=1) if line.startswith("[rank") else line


def _record_level(line: str) -> str | None:
    match = _CPP_RECORD.match(line)
    return (match.group("level") or match.group("old_level")) if match else None


def is_noise(line: str) -> bool:
    """A line of TensorFlow's C++ chatter that says nothing about a failure."""
    level = _record_level(line)
    if level in ("I", "W"):
        return True
    if level in ("E", "F"):
        return bool(_CPP_ERROR_NOISE.search(line))
    return not line.strip() or bool(_PLAIN_NOISE.search(line))


class NoiseFilter:
    """is_noise() for one stream of lines: a noisy record's continuation lines are noise too: the
    task names below "Example stragglers:", and a protocol buffer's text below a record that
    announces one (up to the blank line that ends it, or the first line that is not of it).

    With `blank_lines_shown` (the console), a blank line is noise only where it ends such a text:
    elsewhere it is the program's own spacing, and leaves the filter as it was."""

    def __init__(self, blank_lines_shown: bool = False) -> None:
        self._blank_lines_shown = blank_lines_shown
        self._after_noise = False
        self._dump: int | None = None  # within a noisy record's protocol buffer text: its depth

    def is_noise(self, line: str) -> bool:
        stripped = line.strip()
        if self._dump is not None:
            match = _DUMP_LINE.match(stripped)
            depth = self._dump + bool(match["open"]) - bool(match["close"]) if match else -1
            self._dump = depth if depth >= 0 else None
            if depth >= 0 or not stripped:  # the text goes on, or its blank line ends it
                return True
        if not stripped and self._blank_lines_shown:
            return False
        noisy = is_noise(line)
        self._after_noise = noisy or (self._after_noise and bool(_CONTINUATION.match(stripped)))
        if noisy and _record_level(line) is not None and _DUMP_START.search(line):
            self._dump = 1 if line.rstrip().endswith("{") else 0
        return self._after_noise


def meaningful(lines: Iterable[str]) -> list[str]:
    """`lines` without noise, and without the continuation lines of noisy records."""
    noise = NoiseFilter()
    return [line for line in lines if not noise.is_noise(line)]


def _cut(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


@dataclasses.dataclass(frozen=True)
class PythonError:
    exception: str  # "ValueError: message", first line
    frame: str | None  # "file:line in function: code" of the deepest frame outside libraries


def last_python_error(lines: Sequence[str]) -> PythonError | None:
    """The last traceback in `lines`: its exception line and the user's deepest frame."""
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return None
    frames: list[tuple[str, str]] = []  # (where, code)
    exception = None
    i = starts[-1] + 1
    while i < len(lines):
        line = lines[i]
        match = _FRAME.match(line)
        if match:
            # The source line, indented below its frame; none when the source is not at hand (`python -c`).
            following = lines[i + 1] if i + 1 < len(lines) else ""
            code = following.strip() if following[:1].isspace() and not _FRAME.match(following) else ""
            where = f"{match['file']}:{match['line']} in {match['function']}"
            frames.append((match["file"], f"{where}: {code}" if code else where))
            i += 2 if code else 1
            continue
        if line[:1].isspace() or is_noise(line):  # source markers (^^^^), or chatter from another thread
            i += 1
            continue
        exception = line
        break
    if exception is None:
        return None
    user_frames = [shown for path, shown in frames if not _LIBRARY_PATH.search(path)]
    frame = user_frames[-1] if user_frames else (frames[-1][1] if frames else None)
    return PythonError(_cut(exception), _cut(frame) if frame else None)


def cause(lines: Sequence[str], fallback_lines: int = 20, stderr: Sequence[str] | None = None,
          error: TaskError | None = None) -> tuple[str, list[str]]:
    """Why a task failed: (a title, the lines to show).

    What the task wrote to its error file, if it did; else, from its output: the last Python
    exception with its frame (from `stderr`, the task's stderr lines, when they hold a traceback:
    a stdout line that arrived amid it is not its exception); else the first error line; else
    the last `fallback_lines` meaningful lines (title "last N lines", or "last line").
    """
    if error is not None:
        frame = [f"at {error.frame}"] if error.frame and error.exit == "exception" else []
        return "error file", [_cut(line) for line in [error.headline] + frame]
    kept = meaningful(map(without_rank_prefix, lines))
    error = last_python_error(meaningful(map(without_rank_prefix, stderr))) if stderr is not None else None
    if error is None:
        error = last_python_error(kept)
    if error is not None:
        return "exception", [error.exception] + ([f"at {error.frame}"] if error.frame else [])
    for line in kept:
        if _ERROR_LINE.search(line) or _record_level(line) in ("E", "F"):
            return "first error line", [_cut(line)]
    tail = kept[-fallback_lines:] if fallback_lines else []
    return "last line" if len(tail) == 1 else f"last {len(tail)} lines", [_cut(line) for line in tail]


def last_words(lines: Sequence[str], count: int = 3) -> list[str]:
    """What a task printed last that is not noise (for tasks that never started)."""
    return [_cut(line) for line in meaningful(lines)[-count:]]


# -- the task at fault ------------------------------------------------------------------------


def unhealthy_tasks(lines: Sequence[str]) -> list[str]:
    """The tasks TensorFlow's coordination service reports as unhealthy (their heartbeats stopped),
    as mgpu names them ("worker:1", "chief:0": a TF_CONFIG job name is the task type), in order."""
    names: list[str] = []

    def add(job: str, task: str) -> None:
        name = f"{job}:{int(task)}"
        if name not in names:
            names.append(name)

    for i, line in enumerate(lines):
        if _UNHEALTHY in line:
            for following in lines[i + 1:]:
                match = _TASK_NAME.match(following.strip())
                if not match:
                    break
                add(match["job"], match["task"])
        for match in _HEARTBEAT_TIMEOUT.finditer(line):
            add(match["job"], match["task"])
    return names


def coordination_leader(names: Iterable[str]) -> str | None:
    """The task that runs TensorFlow's coordination service: chief:0 when there is a chief, else worker:0."""
    names = set(names)
    return next((name for name in ("chief:0", "worker:0") if name in names), None)


def leader_unanswered(lines: Sequence[str]) -> bool:
    """Whether the task's heartbeats to the coordination service went unanswered."""
    return any(_LEADER_HEARTBEAT.match(line.strip()) for line in lines)


@dataclasses.dataclass(frozen=True)
class TaskEnd:
    """How a task of the cluster ended, as blame() weighs it."""

    name: str
    failed: bool  # it ended by itself with a non-zero code or a signal, before the launcher stopped the run
    ended_at: float | None = None  # when it failed (seconds since the epoch): its error file's time, else when seen
    running: bool = False  # it was still running when the reporter failed


UNHEALTHY = "unhealthy"  # the reporter said its heartbeats stopped
LEADER_SILENT = "leader silent"  # the reporter's heartbeats to it, the coordination service, went unanswered
FAILED_FIRST = "failed first"  # it failed before the reporter
REPORTER = "reporter"  # nothing points elsewhere


@dataclasses.dataclass(frozen=True)
class Blame:
    task: str  # the task at fault
    reason: str  # UNHEALTHY, LEADER_SILENT, FAILED_FIRST or REPORTER
    others: tuple[str, ...] = ()  # further tasks reported unhealthy


def blame(reporter: TaskEnd, reporter_lines: Sequence[str], peers: Sequence[TaskEnd]) -> Blame:
    """The task at fault when `reporter` failed and stopped the run.

    1. The tasks the reporter says stopped sending heartbeats (a frozen, stopped or killed peer
       makes the others fail, not itself): the first of them that is one of `peers`.
    2. The task that runs the coordination service, if the reporter's heartbeats to it went
       unanswered while it was still running (frozen, or cut off).
    3. A peer that failed by itself before the reporter (its failure often is the reporter's cause).
    4. The reporter.
    """
    known = {peer.name for peer in peers}
    unhealthy = [name for name in unhealthy_tasks(reporter_lines) if name in known and name != reporter.name]
    if unhealthy:
        return Blame(unhealthy[0], UNHEALTHY, tuple(unhealthy[1:]))
    leader = coordination_leader([reporter.name, *known])
    if leader != reporter.name and leader_unanswered(reporter_lines):
        if any(peer.name == leader and peer.running for peer in peers):
            return Blame(leader, LEADER_SILENT)
    if reporter.ended_at is not None:
        earlier = [p for p in peers if p.failed and p.ended_at is not None and p.ended_at < reporter.ended_at]
        if earlier:
            return Blame(min(earlier, key=lambda p: p.ended_at).name, FAILED_FIRST)
    return Blame(reporter.name, REPORTER)


# -- known failures ---------------------------------------------------------------------------
# What a line says happened, by name. What to do about it, in the words of mgpu's command line,
# is fixes.py's: this module knows the frameworks' wording, not mgpu's options.

KERAS3_FIT_UNDER_MWMS = "keras3-fit-under-mwms"
KERAS3_NO_RESET_STATES = "keras3-no-reset-states"
TORCH_ENV_MISSING = "torch-env-missing"
JAX_COORDINATOR_MISSING = "jax-coordinator-missing"
JAX_PROCESSES_MISSING = "jax-processes-missing"
GLOO_CANNOT_CONNECT = "gloo-cannot-connect"
PORT_TAKEN = "port-taken"
HEARTBEATS_STOPPED = "heartbeats-stopped"
PEER_UNREACHABLE = "peer-unreachable"
NO_CHECKPOINT_YET = "no-checkpoint-yet"
KERAS3_TORCH_NO_DISTRIBUTION = "keras3-torch-no-distribution"
ABORTED_AT_EXIT = "aborted-at-exit"


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    pattern: re.Pattern
    kind: str
    # Another line the output must hold too, where one line alone says too little.
    with_line: re.Pattern | None = None


KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(re.compile(r"Attempt to convert a value \(PerReplica"), KERAS3_FIT_UNDER_MWMS),
    # Keras 2's Metric.reset_states(), which Keras 3 renamed reset_state() (TensorFlow's custom-loop tutorials).
    KnownFailure(re.compile(r"AttributeError: '\w+' object has no attribute 'reset_states'"), KERAS3_NO_RESET_STATES),
    KnownFailure(re.compile(r"environment variable (?:RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected, but not set"),
                 TORCH_ENV_MISSING),
    KnownFailure(re.compile(r"coordinator_address should be defined"), JAX_COORDINATOR_MISSING),
    KnownFailure(re.compile(r"Number of processes must be defined|process id of the current process must be defined"),
                 JAX_PROCESSES_MISSING),
    # PyTorch's Gloo process group, listening on an address its peers cannot reach.
    KnownFailure(re.compile(r"Gloo connectFullMesh failed"), GLOO_CANNOT_CONNECT),
    KnownFailure(re.compile(r"(?i:address already in use)|EADDRINUSE|No address added out of total \d+ resolved"
                            r"|Failed to bind"), PORT_TAKEN),
    KnownFailure(re.compile(r"stopped sending heartbeats|heartbeat timeout"
                            r"|^\s*RPC: /tensorflow\.CoordinationService/Heartbeat\s*$"), HEARTBEATS_STOPPED),
    KnownFailure(
        # Not for a heartbeat timeout: that peer is frozen or dead, the network is not to blame.
        re.compile(
            r"^(?!.*(?:stopped sending heartbeats|heartbeat timeout))(?:.*?)(?:"
            r"failed to connect to all addresses|DNS resolution failed|Name or service not known"
            r"|coordination service.*(?:Unavailable|UNAVAILABLE|Deadline|DEADLINE)"
            r"|(?:Unavailable|UNAVAILABLE|DeadlineExceeded|DEADLINE_EXCEEDED).*(?:coordination|heartbeat|RegisterTask))"
        ),
        PEER_UNREACHABLE,
    ),
    KnownFailure(re.compile(r"Failed to find any matching files for|latest_checkpoint.*None|No checkpoint (?:found|in)"),
                 NO_CHECKPOINT_YET),
    # keras.distribution.initialize() on a backend without a distribution library (torch, up to Keras 3.15).
    KnownFailure(re.compile(r"^AttributeError: 'NoneType' object has no attribute 'initialize'"),
                 KERAS3_TORCH_NO_DISTRIBUTION,
                 with_line=re.compile(r"distribution_lib\.initialize\(job_addresses, num_processes, process_id\)")),
    # C++'s std::terminate for a thread left running: in PyTorch, a process group's threads (Gloo, the
    # TCPStore) torn down at exit while still in use.
    KnownFailure(re.compile(r"terminate called without an active exception"), ABORTED_AT_EXIT),
)
# Known failures that may be the network's: the reachability test is run again to tell.
NETWORK_FAILURES = frozenset({GLOO_CANNOT_CONNECT, HEARTBEATS_STOPPED, PEER_UNREACHABLE})


def known_failures(lines: Iterable[str]) -> list[str]:
    """The kind of each known failure whose wording is in `lines`, in table order, each once."""
    found, seconded = set(), set()
    for line in map(without_rank_prefix, lines):
        for i, known in enumerate(KNOWN_FAILURES):
            if i not in found and known.pattern.search(line):
                found.add(i)
            if known.with_line is not None and i not in seconded and known.with_line.search(line):
                seconded.add(i)
    return [KNOWN_FAILURES[i].kind for i in sorted(found)
            if KNOWN_FAILURES[i].with_line is None or i in seconded]
