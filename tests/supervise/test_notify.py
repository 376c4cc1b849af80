"""Word when something happens (notify.py): a real command and a real HTTP server on 127.0.0.1.

Nothing here waits for so many seconds: a command that must still be running holds on a file the
test writes, and every wait for a file or a request is bounded."""

import http.server
import json
import os
import sys
import threading
import time

import pytest

from launcher.supervise import causes
from launcher.supervise.notify import Notifier, check_url
from launcher.supervise.sizes import SizeChange
from launching import mgpu_env, run_mgpu
from supervisor_helpers import pid_alive

pytestmark = pytest.mark.timeout(60)
DEADLINE = 30.0  # seconds any one wait below may take on a loaded machine


def wait_for(condition, what: str):
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"no {what} in {DEADLINE:g} s"
        time.sleep(0.02)


class Hook:
    """An HTTP server on 127.0.0.1 that keeps what is posted to it and answers `status`."""

    def __init__(self, status: int = 200):
        self.posts: list[tuple[str, dict]] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.posts.append((self.headers["Content-Type"], json.loads(body)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/x"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(DEADLINE)


@pytest.fixture
def hook():
    made = Hook()
    yield made
    made.close()


def test_a_run_tells_the_command_and_the_url_what_happened_and_never_an_env_value(run_id, tmp_path, hook):
    events = tmp_path / "events"
    # The last notice takes a while: mgpu waits for it before it exits.
    command = (f"case \"$MGPU_EVENT\" in *run-ended*) sleep 0.5;; esac; "
               f"cat >> {events}.stdin; echo >> {events}.stdin; printf '%s\\n' \"$MGPU_EVENT\" >> {events}.env")
    # The second attempt reports steps, so that the run's end has a goodput to tell.
    code = ("import os, sys, time\nif os.environ['MGPU_ATTEMPT'] == '0': sys.exit(3)\n"
            "for step in (1, 2, 3): print(f'MGPU_PROGRESS {step}/3', flush=True); time.sleep(0.1)")
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                    "--max-restarts", "1", "--env", "WANDB_API_KEY=s3cret-value", "--notify", command,
                    "--", sys.executable, "-c", code, env=mgpu_env(MGPU_NOTIFY_URL=hook.url))
    assert done.returncode == 0, done.stderr
    told = [json.loads(line) for line in (tmp_path / "events.stdin").read_text().splitlines()]
    assert [json.loads(line) for line in (tmp_path / "events.env").read_text().splitlines()] == told
    assert [e["event"] for e in told] == ["run-started", "attempt-failed", "run-ended"]
    started, failed, ended = told
    assert started["run_id"] == run_id and started["tasks"] == 1 and started["hosts"] == ["127.0.0.1"]
    assert started["host_count"] == 1
    assert (failed["attempt"], failed["cause"], failed["task"], failed["host"], failed["detail"]) == (
        1, "program-error", "worker:0", "127.0.0.1", "exited with code 3")
    assert ended["status"] == "succeeded" and ended["exit_code"] == 0 and 0 < ended["goodput"] < 1
    assert ended["text"].startswith(f"run {run_id} succeeded (exit code 0); goodput ")
    # The URL got the same events, as JSON, in order: mgpu let the last one go before it exited.
    assert [body for _, body in hook.posts] == told
    assert {kind for kind, _ in hook.posts} == {"application/json"}
    everything = (tmp_path / "events.stdin").read_text() + json.dumps(hook.posts)
    assert "s3cret-value" not in everything and "WANDB_API_KEY" not in everything
    assert "notices:" not in done.stdout + done.stderr  # nothing failed, nothing to say


def test_supervision_never_waits_on_a_notice_and_what_is_dropped_is_counted(tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    command = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done"
    notifier = Notifier("r1", command=command, timeout=DEADLINE, queue_size=3)
    notifier.run_started(2, ["h1", "h2"], detached=True)
    wait_for(started.exists, "command started")
    for attempt in range(1, 6):  # the command is held: three wait, two are dropped
        notifier.attempt_failed(attempt, causes.Cause(causes.PROGRAM_ERROR, "worker:0", "h1", "exited with code 1"))
    notifier.run_ended("succeeded", 0, None, {"goodput": 1.0})  # the queue is still full
    assert notifier.counts.dropped == 3 and notifier.counts.sent == 0
    go.touch()
    counts = notifier.close()
    assert (counts.sent, counts.failed, counts.dropped) == (4, 0, 3)


def test_a_command_over_its_time_is_stopped_with_what_it_started_and_failures_are_said_once(tmp_path):
    pids = tmp_path / "pids"
    said: list[str] = []
    notifier = Notifier("r1", command=f"sleep 60 & echo $! >> {pids}; wait", report=said.append, timeout=0.5)
    failing = Notifier("r1", command="printf 'bad \\033[2Jnews\\n' >&2; exit 3", report=said.append)
    failing.run_started(1, ["h1"], detached=False)
    assert failing.finish("succeeded", None, 0, {}) == "notices: 0 sent, 2 failed, 0 dropped (a queue of 64, 10 s each)"
    assert said == ["a notice failed (run-started): the command exited with code 3: bad \\x1b[2Jnews; "
                    "the failures are counted, and said again at the end"]
    said.clear()
    for attempt in (1, 2):
        notifier.attempt_failed(attempt, causes.Cause(causes.STALLED, "worker:0", "h1", "no progress"))
    ended = notifier.finish("failed", "stall: no training task made progress for 1800 s\nmore", 1, {})
    assert notifier.counts.failed == 3 and notifier.counts.sent == 0
    assert said == ["a notice failed (stalled): the command took over 0.5 s and was stopped; "
                    "the failures are counted, and said again at the end"]
    assert ended == "notices: 0 sent, 3 failed, 0 dropped (a queue of 64, 0.5 s each)"
    for pid in map(int, pids.read_text().split()):
        wait_for(lambda: not pid_alive(pid), f"end of the command's sleep {pid}")


def test_a_url_that_fails_is_counted_and_a_programs_words_cannot_mention_anyone(tmp_path):
    failing = Hook(status=500)
    said: list[str] = []
    try:
        notifier = Notifier("r1", url=failing.url, report=said.append)
        detail = "<!channel> & <@U123> " + "x" * 1000
        notifier.host_left_out("h2", f"program-error: {detail}", None)
        notifier.finish("failed", "worker:1 on h2 exited with code 13", 1, {"goodput": 0.5})
    finally:
        failing.close()
    assert said == ["a notice failed (host-left-out): the URL answered HTTP 500; "
                    "the failures are counted, and said again at the end"]
    left_out = failing.posts[0][1]
    assert left_out["event"] == "host-left-out" and left_out["spare"] is None
    assert "<!channel>" not in left_out["text"] and "&lt;!channel&gt; &amp; &lt;@U123&gt;" in left_out["text"]
    assert len(left_out["why"]) == 300
    assert failing.posts[1][1]["text"] == "run r1 failed (exit code 1); goodput 50%: worker:1 on h2 exited with code 13"


def test_nothing_to_tell_starts_nothing_and_bad_urls_are_refused(tmp_path):
    done = run_mgpu("launch", "--local", "1", "--notify-url", "file:///etc/passwd", "--dry-run")
    assert (done.returncode, done.stderr) == (2, "mgpu: error: Invalid value for '--notify-url' (env var: "
                                                 "'MGPU_NOTIFY_URL'): give an http:// or https:// URL with a host\n")
    many = tmp_path / "many"
    said: list[str] = []
    crowded = Notifier("r1", command=f"printf '%s\\n' \"$MGPU_EVENT\" >> {many}", report=said.append)
    crowded.run_started(4096, [f"node{i:04d}-" + "x" * 240 for i in range(4096)], detached=False)
    assert crowded.finish("succeeded", None, 0, {}) is None, said
    started = json.loads(many.read_text().splitlines()[0])
    assert len(started["hosts"]) == 64 and started["host_count"] == 4096
    quiet = Notifier("r1")
    quiet.run_started(1, ["h1"], detached=False)
    assert quiet.finish("succeeded", None, 0, {}) is None and quiet._thread is None
    for bad in ("ftp://h/x", "http:///x", "https://h/a b", "file:///etc/passwd"):
        with pytest.raises(ValueError):
            check_url(bad)
    assert check_url("https://hooks.slack.com/services/T0/B0/x") == "https://hooks.slack.com/services/T0/B0/x"
    assert os.environ.get("MGPU_EVENT") is None


def test_a_run_on_fewer_hosts_and_a_host_taken_back_are_told_with_the_sizes_and_why(tmp_path):
    told = tmp_path / "told"
    notifier = Notifier("r1", command=f"cat >> {told}; echo >> {told}")
    notifier.host_left_out("h2", "host-lost: <!here> gone", None, goes_on=True)
    notifier.size_changed(SizeChange(0.0, ("h2",), "h2: host-lost: gone", 3, 2, 6, 4, 3))
    notifier.host_taken_back("h2")
    notifier.size_changed(SizeChange(1.0, (), "taken back", 2, 3, 4, 6, 3, back=("h2",)))
    assert notifier.finish("succeeded", None, 0, {}) is None
    left, smaller, back, bigger, _ = [json.loads(line) for line in told.read_text().splitlines()]
    assert (left["event"], left["spare"], left["goes_on"]) == ("host-left-out", None, True)
    assert left["text"] == "run r1: h2 left out (host-lost: &lt;!here&gt; gone); no spare left: the run goes on without it"
    assert {key: smaller[key] for key in ("event", "hosts_from", "hosts_to", "planned", "tasks_from", "tasks_to",
                                          "dropped", "back", "why")} == {
        "event": "size-changed", "hosts_from": 3, "hosts_to": 2, "planned": 3, "tasks_from": 6, "tasks_to": 4,
        "dropped": ["h2"], "back": [], "why": "h2: host-lost: gone"}
    assert smaller["text"] == "run r1: now on 2 of 3 hosts, from 3: without h2 (h2: host-lost: gone)"
    assert (back["event"], back["host"], back["text"]) == ("host-taken-back", "h2", "run r1: h2 taken back")
    assert (bigger["event"], bigger["hosts_to"], bigger["back"]) == ("size-changed", 3, ["h2"])
    assert bigger["text"] == "run r1: now on 3 of 3 hosts, from 2: h2 taken back"


def test_run_started_counts_its_tasks_and_hosts_in_words_that_agree(tmp_path):
    said = tmp_path / "events"
    notifier = Notifier("r1", command=f'printf "%s\\n" "$MGPU_EVENT" >> {said}')
    notifier.run_started(2, ["127.0.0.1"], detached=True)
    notifier.run_started(1, ["h1", "h2"], detached=False)
    assert notifier.close().sent == 2
    texts = [json.loads(line)["text"] for line in said.read_text().splitlines()]
    assert texts == ["run r1 started: 2 tasks on 1 host", "run r1 started: 1 task on 2 hosts"]
