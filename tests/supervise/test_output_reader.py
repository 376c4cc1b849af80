"""The output path under hostile bytes: the log is byte-exact and nothing a task prints stops the reader.

The streams are io.BytesIO objects read in-process through TaskOutput, with the real log file,
the real console writer and every built-in watcher; read1 returns pieces at chosen boundaries.
"""

import io
import json
import os
import random
import threading
import time

import pytest

from launcher import protocol
from launcher.supervise import diagnosis
from launcher.supervise.output import Console, TaskOutput
from launcher.supervise.task_log import HOLD, PIECE, TaskLog
from launcher.supervise.watchers import LineWatcher
from supervisor_helpers import make_plans

pytestmark = pytest.mark.timeout(300)

HOSTILE_LINES = [
    b"MGPU_TASK_READY\n",
    "MGPU_PROGRESS \u00b2/3\n".encode(),  # str.isdigit() says yes, int() says no
    b"MGPU_PROGRESS 5/" + b"9" * 400 + b"\n",  # past what tqdm can format
    b"MGPU_PROGRESS " + b"1" * 5000 + b"/" + b"2" * 5000 + b"\n",  # past int()'s digit limit
    "MGPU_PROGRESS \u0663/\u0664\n".encode(),
    b"MGPU_PROGRESS 999999999999999999/1\n", b"MGPU_PROGRESS 1/999999999999999999\n",
    b"MGPU_PROGRESS 3/0\n", b"MGPU_PROGRESS 9/3\n", b"MGPU_PROGRESS -1/3\n", b"MGPU_PROGRESS 1/3\r\n",
    b"No address added out of total 1 resolved for 'x:" + b"7" * 5000 + b"'\n",
    b"No address added out of total 1 resolved for 'x:99999'\n",
    b"No address added out of total " + b"9" * 5000 + b" resolved for 'h:1'\n",
    b"E1123 12:00:05.123 1234 server.cc:12] Failed to bind \xff\xfe\n",
    b"I1123 12:00:05.123 1234 file.cc:12] chatter\n/job:worker/replica:0/task:1\n",
    b"\x1b]0;title\x07\x1b[2K\x1b[1A forged [mgpu] line\n",
    b"bar 1/3\rbar 2/3\rbar 3/3\b\b\b\r\n",
    b"\r\r\r\b\b\n", b"\n", b"\x00\x00\n", "\u202e\u2066 reversed\n".encode(),
    b"\xe2\x82", b"\xac and the rest of a split euro sign\n",  # UTF-8 cut in two
]


def small_plan(run_id):
    return make_plans(run_id, [], workers=1)[0]


class ChunkedStream(io.BytesIO):
    """A stream whose read1 returns the bytes in the given pieces, then at most `size` at a time."""

    def __init__(self, data: bytes, sizes=()):
        super().__init__(data)
        self._sizes = list(sizes)

    def read1(self, size=-1):
        if self._sizes:
            return super().read1(min(size, self._sizes.pop(0)) if size >= 0 else self._sizes.pop(0))
        return super().read1(size)


def log_lines(data: bytes) -> list[bytes]:
    """Lines ended by \\n only (bytes.splitlines also ends them at \\r)."""
    *lines, last = data.split(b"\n")
    return [line + b"\n" for line in lines] + ([last] if last else [])


def random_splits(rng: random.Random, length: int) -> list[int]:
    sizes = []
    while sum(sizes) < length:
        sizes.append(rng.choice([1, 2, 3, 7, 100, 4096, PIECE - 1, PIECE, PIECE + 1, 200_000]))
    return sizes


def hostile_stream(rng: random.Random, size: int) -> bytes:
    parts = []
    while sum(map(len, parts)) < size:
        kind = rng.randrange(7)
        if kind == 0:
            parts.append(rng.randbytes(rng.randrange(1, 3000)))
        elif kind == 1:
            parts.append(rng.choice(HOSTILE_LINES))
        elif kind == 2:
            parts.append(bytes(rng.choice(b"\r\b\n\x1bx") for _ in range(rng.randrange(1, 300))))
        elif kind == 3:
            parts.append(b'{"k": "' + b"v" * rng.randrange(PIECE - 2, 3 * PIECE) + b'"}' + rng.choice([b"\n", b""]))
        elif kind == 4:
            parts.append(b"".join(rng.choice(HOSTILE_LINES) for _ in range(20)))
        elif kind == 5:
            parts.append(f"line {rng.random()} \u00e9\u20ac\U0001f600\n".encode())
        else:
            parts.append(b"x" * rng.randrange(1, 200) + b"\r")
    return b"".join(parts)


class Run:
    """One TaskOutput over in-memory streams: its log bytes, console text and launcher notices."""

    def __init__(self, run_id, tmp_path, stdout, stderr=b"", show_tf_logs=False, watchers=(), stdout_sizes=(),
                 stderr_sizes=()):
        self.log_path = tmp_path / f"task-{random.random()}.log"
        console_stream = io.StringIO()
        console = Console(console_stream)
        self.notices: list[str] = []
        self.output = TaskOutput(small_plan(run_id), 0, self.log_path, open(self.log_path, "ab"), console, False,
                                 show_tf_logs, notice=self.notices.append, watchers=watchers)
        self.output.attach(ChunkedStream(stdout, stdout_sizes), ChunkedStream(stderr, stderr_sizes))
        self.drained = self.output.drained(60)
        self.output.close()
        console.close()
        self.log = self.log_path.read_bytes()
        self.console = console_stream.getvalue()


@pytest.mark.parametrize("seed", range(12))
def test_hostile_bytes_reach_the_log_exactly_and_never_stop_the_reader(run_id, tmp_path, seed):
    rng = random.Random(seed)
    data = hostile_stream(rng, 400_000) + b"\nMGPU_TASK_READY\nlast words"
    run = Run(run_id, tmp_path, data, stdout_sizes=random_splits(rng, len(data)), show_tf_logs=bool(seed % 2))
    assert run.drained
    assert run.log == data
    assert run.notices == []  # no watcher failed
    assert run.output.ready.is_set() and run.output.tail[-1].text == "last words"
    assert "[worker:0] last words\n" in run.console
    assert not any(c in run.console for c in "\x1b\r\b\x07\u202e")


def test_every_read_boundary(run_id, tmp_path):
    data = b"".join(line for line in HOSTILE_LINES if len(line) < 500) + b"after\n" + b"unended"
    for cut in range(1, len(data) + 1):
        run = Run(run_id, tmp_path, data, stdout_sizes=[cut, len(data)])
        assert run.log == data, cut
        assert run.notices == [] and run.output.ready.is_set(), cut
        assert "[worker:0] after\n" in run.console and "[worker:0] unended\n" in run.console, cut


@pytest.mark.parametrize("line", [line for line in HOSTILE_LINES if b"MGPU_TASK_READY" not in line])
def test_lines_after_a_hostile_line_reach_the_log_and_the_console(run_id, tmp_path, line):
    tail = b"".join(b"after %d\n" % i for i in range(20_000))
    run = Run(run_id, tmp_path, line + b"\n" + tail)
    assert run.log == line + b"\n" + tail
    assert run.notices == []
    assert "[worker:0] after 19999\n" in run.console
    assert run.output.tail[-1].text == "after 19999"


def test_bind_failures_naming_no_usable_port(run_id, tmp_path):
    run = Run(run_id, tmp_path, b"".join(line for line in HOSTILE_LINES if b"'x:" in line))
    assert run.output.bind_failure == 0  # a bind failure, without a port number that could be one


def test_long_lines_stay_whole_in_the_log_while_the_other_stream_goes_on(run_id, tmp_path):
    document = json.dumps({"values": list(range(50_000))}).encode() + b"\n"  # a 300 KB line
    assert len(document) > 4 * PIECE
    stderr = b"".join(b"\x00stderr %d\n" % i for i in range(2_000))
    rng = random.Random(7)
    run = Run(run_id, tmp_path, document * 3, stderr, stdout_sizes=random_splits(rng, 3 * len(document)),
              stderr_sizes=[7] * 3000)
    lines = log_lines(run.log)
    assert [json.loads(line) for line in lines if not line.startswith(b"\x00")] == [json.loads(document)] * 3
    assert b"".join(line for line in lines if line.startswith(b"\x00")) == stderr


@pytest.mark.parametrize("seed", range(6))
def test_two_hostile_streams_keep_their_lines_whole_and_in_order(run_id, tmp_path, seed):
    rng = random.Random(100 + seed)
    stdout = hostile_stream(rng, 300_000).replace(b"\x00", b"0") + b"\n"
    stderr = b"".join(b"\x00" + rng.randbytes(rng.randrange(0, 2000)).replace(b"\n", b"N") + b"\n"
                      for _ in range(300))
    run = Run(run_id, tmp_path, stdout, stderr, stdout_sizes=random_splits(rng, len(stdout)),
              stderr_sizes=random_splits(rng, len(stderr)))
    lines = log_lines(run.log)
    assert b"".join(line for line in lines if not line.startswith(b"\x00")) == stdout
    assert b"".join(line for line in lines if line.startswith(b"\x00")) == stderr
    assert len(run.log) == len(stdout) + len(stderr)


class Failing(LineWatcher):
    name = "failing watcher"

    def __init__(self):
        self.calls = 0

    def line(self, line):
        self.calls += 1
        raise RuntimeError("a bug " + "x" * 1000)


def test_a_failing_watcher_is_reported_once_and_stops_nothing(run_id, tmp_path):
    failing = Failing()
    data = b"MGPU_TASK_READY\n" + b"".join(b"line %d\n" % i for i in range(10_000))
    run = Run(run_id, tmp_path, data, b"err\n", watchers=[failing])
    assert [line for line in log_lines(run.log) if line != b"err\n"] == log_lines(data) and b"err\n" in run.log
    assert failing.calls == 10_002  # it still sees every line
    assert len(run.notices) == 1 and "failing watcher of worker:0 failed (RuntimeError: a bug" in run.notices[0]
    assert len(run.notices[0]) < 400
    assert run.output.ready.is_set() and "[worker:0] line 9999\n" in run.console


def test_last_activity_follows_the_reads(run_id, tmp_path):
    read_end, write_end = os.pipe()
    output = TaskOutput(small_plan(run_id), 0, tmp_path / "a.log", open(tmp_path / "a.log", "ab"), None, False)
    opened = output.last_activity
    assert opened <= time.monotonic()
    output.attach(os.fdopen(read_end, "rb"), io.BytesIO(b""))
    before = time.monotonic()
    os.write(write_end, b"hello\n")
    deadline = time.monotonic() + 30
    while output.last_activity < before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert output.last_activity >= before
    os.close(write_end)
    assert output.drained(30)
    output.close()


def test_the_log_waits_for_a_long_line_of_the_other_stream_up_to_a_bound(tmp_path):
    reports = []
    with open(tmp_path / "a.log", "wb") as file:
        log = TaskLog(file, reports.append, "worker:0")
        log.write(True, b"a" * (PIECE + 1))  # a long unfinished line: written as it comes
        log.write(False, b"err 1\n")  # waits for the line to end
        log.write(True, b"a\nb")
        log.write(True, b"b" * (PIECE + 1))
        log.write(False, b"e" * HOLD + b"\n")  # past the bound: the long line is broken
        log.write(False, b"err 3\n")
        log.write(True, b"c" * (PIECE + 1))
        log.end(True)  # ended in the middle of a line: the other stream's lines follow on their own
        log.write(False, b"err 4\n")
        log.close()
    assert reports == []
    assert (tmp_path / "a.log").read_bytes() == (
        b"a" * (PIECE + 1) + b"a\n" + b"err 1\n" + b"b" * (PIECE + 2) + b"\n" + b"e" * HOLD + b"\n" + b"err 3\n"
        + b"c" * (PIECE + 1) + b"\n" + b"err 4\n")


def test_a_log_that_cannot_be_written_is_reported_once_and_the_stream_still_read(run_id, tmp_path):
    notices = []
    full = open("/dev/full", "wb", buffering=0)
    output = TaskOutput(small_plan(run_id), 0, tmp_path / "a.log", full, None, False, notice=notices.append)
    stream = ChunkedStream(b"".join(b"line %d\n" % i for i in range(10_000)), [100] * 2000)
    output.attach(stream, io.BytesIO(b""))
    assert output.drained(30)
    output.close()
    assert len(notices) == 1 and "cannot write the log of worker:0" in notices[0]
    assert output.tail[-1].text == "line 9999"


def test_console_close_writes_everything_queued():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    console = Console(stream)
    for i in range(20_000):  # more than the pipe holds: the writer waits in a write
        console.write_line(f"line {i}\n")
    console.write_line("[mgpu] closing line\n", always=True)
    closed = threading.Event()
    threading.Thread(target=lambda: (console.close(), stream.close(), closed.set()), daemon=True).start()
    received = os.fdopen(read_end, "rb").read()  # to the end: close() has written everything and returned
    assert closed.wait(30)
    assert received.endswith(b"[mgpu] closing line\n") and b"line 19999\n" in received


class TimingOut(ChunkedStream):
    """A stream with a read timeout: every other read times out before its bytes come."""

    def __init__(self, data):
        super().__init__(data, [10] * (len(data) // 10 + 1))
        self._timed_out = False

    def read1(self, size=-1):
        self._timed_out = not self._timed_out
        if self._timed_out:
            raise TimeoutError("timed out")
        return super().read1(size)


def test_a_read_timeout_does_not_end_the_stream(run_id, tmp_path):
    data = b"".join(b"line %d\n" % i for i in range(100))
    log_path = tmp_path / "a.log"
    output = TaskOutput(small_plan(run_id), 0, log_path, open(log_path, "ab"), None, False)
    output.attach(TimingOut(data), io.BytesIO(b""))
    assert output.drained(30)
    output.close()
    assert log_path.read_bytes() == data


def test_progress_numbers_are_ascii_digits_of_bounded_length():
    assert protocol.parse_progress("MGPU_PROGRESS 999999999999999999/1") == (10**18 - 1, 1)
    for line in ["MGPU_PROGRESS \u00b2/3", "MGPU_PROGRESS \u0663/4", "MGPU_PROGRESS 1000000000000000000/1",
                 "MGPU_PROGRESS 5/" + "9" * 400, "MGPU_PROGRESS -1/3", "MGPU_PROGRESS 1/2/3"]:
        assert protocol.parse_progress(line) is None, line
    assert diagnosis.bind_failure("No address added out of total 1 resolved for 'x:" + "7" * 5000 + "'") == 0
    assert diagnosis.bind_failure("No address added out of total 1 resolved for 'x:70000'") == 0
    assert diagnosis.bind_failure("No address added out of total 1 resolved for '[::1]:2222'") == 2222


def test_time_split_lines_are_summed_kept_in_the_log_and_left_off_the_console(run_id, tmp_path):
    data = b"step 1\nMGPU_TIME_SPLIT 900 100\nMGPU_TIME_SPLIT 1200 300\r\nMGPU_TIME_SPLIT 5 6\n"
    run = Run(run_id, tmp_path, data)
    assert run.log == data
    assert run.output.time_split.total() == (2105, 406)
    assert "MGPU_TIME_SPLIT" not in run.console and "[worker:0] step 1\n" in run.console
    assert run.output.progress.snapshot()[0] == "step 1"  # not the last line mgpu status shows
    # On stderr, or malformed: an ordinary line.
    for line in ["MGPU_TIME_SPLIT -1 3", "MGPU_TIME_SPLIT 1 \u0663", "MGPU_TIME_SPLIT 1", "MGPU_TIME_SPLIT 1 2 3",
                 "MGPU_TIME_SPLIT " + "9" * 16 + " 1"]:
        assert protocol.parse_time_split(line) is None, line
        shown = Run(run_id, tmp_path, line.encode() + b"\n")
        assert shown.output.time_split.total() is None and f"[worker:0] {line}\n" in shown.console
    on_stderr = Run(run_id, tmp_path, b"", stderr=b"MGPU_TIME_SPLIT 7000 0\n")
    assert on_stderr.output.time_split.total() is None and "MGPU_TIME_SPLIT 7000 0" in on_stderr.console
