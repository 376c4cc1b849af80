"""The failure summary's text from what the supervisor saw (summary.py), without processes."""

import datetime
import pathlib

from launcher.error_file import TaskError
from launcher.supervise import diagnosis
from launcher.supervise.summary import TaskView, failure_summary

RUN = pathlib.Path("/runs/r")


def view(name, returncode, ended_at, lines=(), error=None, stderr=True):
    tail = [diagnosis.TaskLine(line, stderr) for line in lines]
    return TaskView(name, "127.0.0.1", 2222, True, tail, RUN / f"{name.replace(':', '-')}.log",
                    returncode=returncode, ended_at=ended_at, error=error)


def error(message, at, exception="ValueError", frame="/home/me/train.py:3 in step: x = 1 / 0"):
    when = datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
    return TaskError(exception, message, frame, None, "exception", when)


def test_a_peer_that_failed_first_is_the_task_at_fault():
    # Both seen ended by one poll of the supervisor; worker:1's error file is the earlier.
    reporter = view("worker:0", 1, 100.0, error=error("peer gone", 99.9, "UnavailableError"))
    peer = view("worker:1", 3, 100.0, error=error("shard 7 is missing", 99.2))
    text = failure_summary(reporter, [peer], ", after 1 restart").splitlines()
    assert text == [
        "worker:1 on 127.0.0.1 exited with code 3 (before worker:0, which exited with code 1), after 1 restart",
        "  ValueError: shard 7 is missing",
        "  at /home/me/train.py:3 in step: x = 1 / 0",
        "worker:0 reported:",
        "  UnavailableError: peer gone",
        "  at /home/me/train.py:3 in step: x = 1 / 0",
        f"log: {RUN / 'worker-1.log'}",
        f"log: {RUN / 'worker-0.log'}",
    ]
    # A peer that ended later (stopped by the launcher) is not at fault.
    later = view("worker:1", -15, 101.0, lines=["Traceback (most recent call last):", "KeyError: 'x'"])
    assert failure_summary(reporter, [later]).splitlines()[0] == "worker:0 on 127.0.0.1 exited with code 1"


def test_the_error_file_comes_before_the_output():
    lines = ["Traceback (most recent call last):", '  File "/t.py", line 1, in <module>', "KeyError: 'from the log'"]
    task = view("worker:0", 1, 5.0, lines, error=error("from the file", 4.0))
    assert failure_summary(task).splitlines()[1] == "  ValueError: from the file"
    assert failure_summary(view("worker:0", 1, 5.0, lines)).splitlines()[1] == "  KeyError: 'from the log'"


def test_a_frozen_peer_shows_no_last_lines_but_what_its_reporter_said():
    report = ["E0000 00:00:1.5 7 c.cc:1] UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
              "/job:worker/replica:0/task:1", "/job:worker/replica:0/task:2"]
    peers = [view("worker:1", -9, 130.0, ["MGPU_TASK_READY"], stderr=False), view("worker:2", -9, 130.0),
             view("worker:3", -9, 130.0)]
    text = failure_summary(view("worker:0", 1, 120.0, report), peers).splitlines()
    assert text[0] == ("worker:1 on 127.0.0.1 stopped sending heartbeats, and so did worker:2 "
                       "(reported by worker:0, which exited with code 1)")
    assert text[1:3] == ["worker:0 reported:", "  " + report[0]]
    [hint] = [line for line in text if line.startswith("hint: ")]
    assert hint.startswith("hint: a task stopped sending or answering heartbeats")


def test_the_closing_line_tells_each_restart_and_the_time_lost():
    import datetime
    import pathlib

    from launcher.supervise.causes import HOST_LOST, Cause
    from launcher.supervise.summary import closing_line, duration, restart_story

    assert [duration(s) for s in (41.34, 725, 75840)] == ["41.3 s", "12 min 5 s", "21 h 4 min"]
    at = datetime.datetime(2026, 1, 2, 17, 41).timestamp()
    story = restart_story(Cause(HOST_LOST, "worker:1", "h2", "SSH keepalives unanswered"), at, "h5 took worker:1")
    assert closing_line(4, 4, 75840, 1, pathlib.Path("runs/r"), [story], 540) == (
        "done: 4 tasks succeeded in 21 h 4 min; 1 restart (h2 lost at 17:41: SSH keepalives unanswered; "
        "h5 took worker:1); 9 min 0 s lost; logs and run.json in runs/r/")
