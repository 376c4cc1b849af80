"""The report's page and trace from records made by hand: what it shows, that a record's text is
shown as text, that figures it does not know or lacks are shown or left out without failing, and
that a hostile record is bounded. Pure: no process, no browser."""

import copy
import html.parser
import json
import pathlib

import pytest

from launcher.report import busy, page, story, svg, trace

T0 = "2026-01-02T03:04:05.000+00:00"


def at(seconds: float) -> str:
    return f"2026-01-02T03:04:{5 + seconds:06.3f}+00:00"


def task(host="h1", start=0.0, ready=None, end=None, code=None, sig=None, log="worker-0.log", busy=None, step=None):
    return {"host": host, "pid": 10, "log": log, "started_at": at(start),
            "ready_at": None if ready is None else at(ready),
            "ended_at": None if end is None else at(end), "exit_code": code, "signal": sig, "failure_ignored": False,
            "last_line": None, "progress": None if step is None else {"step": step, "total": 20, "rate": 2.0,
                                                                       "eta_s": 1.0, "at": at(end or 0)},
            "busy": None if busy is None else {"share": busy, "source": "cpu", "window_s": 60.0}}


def record(**changes):
    """A run of two workers on h1 and h2: attempt 0 fails (worker:1 on h2, its error text holding
    markup), h2 is left out and h3 takes worker:1; attempt 1 succeeds."""
    data = {
        "run_id": "20260102-030405-abc", "status": "succeeded", "message": None, "exit_code": 0,
        "started_at": T0, "ended_at": at(20),
        "options": {"grace_period": 10.0, "max_restarts": 3},
        "attempts": [
            {"attempt": 0, "started_at": at(0.5), "ended_at": at(8), "outcome": "failed",
             "tasks": {"worker:0": task("h1", 0.5, 2, 8, sig="SIGTERM", busy=0.4, step=12),
                       "worker:1": task("h2", 0.5, 2.5, 7.9, code=1, log="worker-1.log", busy=0.95, step=12)},
             "ready_at": at(2.5), "progress": {"last_step": 12, "gained": 12}, "time_lost_s": 1.5,
             "cause": "program-error", "task": "worker:1", "host": "h2",
             "detail": "ValueError: <script>alert('x')</script> & <b>bold</b>"},
            {"attempt": 1, "started_at": at(10), "ended_at": at(19.5), "outcome": "succeeded",
             "tasks": {"worker:0": task("h1", 10, 11, 19, code=0, busy=0.5, step=20),
                       "worker:1": task("h3", 10, 11.5, 19.4, code=0, log="worker-1.log", busy=0.6, step=20)},
             "ready_at": at(11.5), "progress": {"last_step": 20, "gained": 8}, "time_lost_s": 0.0},
        ],
        "costs": {"restarts": 1, "left_out": [{"host": "h2", "cause": "program-error", "at": at(8),
                                               "replaced_by": "h3 took worker:1"}],
                  "time_lost_s": 1.5, "wall_s": 20.0, "goodput": 0.925},
        "plans": [{"name": "worker:0", "type": "worker", "index": 0, "host": "h1", "address": "10.0.0.1",
                   "argv": ["python3", "train.py", "--epochs", "3"], "gpus": "0"},
                  {"name": "worker:1", "type": "worker", "index": 1, "host": "h3", "address": "10.0.0.3",
                   "argv": ["python3", "train.py", "--epochs", "3"], "gpus": "0"}],
    }
    data.update(changes)
    return data


class Page(html.parser.HTMLParser):
    """The page as a browser's parser reads it: its elements and its text."""

    def __init__(self, text):
        super().__init__()
        self.tags, self.text, self.links = [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "a":
            self.links.append(dict(attrs).get("href"))

    def handle_data(self, data):
        self.text.append(data)

    @property
    def words(self):
        return " ".join(" ".join(self.text).split())


def render(data, checks=None):
    told = story.story(data, checks)
    return told, page.render(told, {name: log for name, log in told.logs}, "trace.json")


def test_the_page_tells_the_run():
    told, text = render(record())
    shown = Page(text)
    words = shown.words
    assert "python3 train.py --epochs 3" in words
    for name in ("worker:0", "worker:1", "h1", "h2", "h3"):
        assert name in words
    assert "program-error" in words and "h3 took worker:1" in words  # the cause; who took the host's place
    assert "92.5%" in words  # the goodput
    assert "2 tasks on 3 hosts; 1 restart" in words
    assert [b.task for b in told.bars].count("worker:1") == 2  # a bar per attempt
    bars = {(b.task, b.attempt): b for b in told.bars}
    assert bars["worker:1", 1].at_fault and not bars["worker:0", 1].at_fault
    failed = bars["worker:1", 1]
    assert (failed.start, failed.ready, failed.end) == pytest.approx((0.5, 2.5, 7.9))
    assert told.wall == 20.0
    assert told.hosts.rows == (("h1", "worker:0", "10.0.0.1", "0"), ("h3", "worker:1", "10.0.0.3", "0"),
                               ("h2", "worker:1", "", ""))  # the host left out, from the attempt it ran in
    assert ">#1 h2</text>" in text and ">#2 h3</text>" in text  # who ran each attempt (as the console counts), on the bar
    assert text.count('class="bar ') == 4 and text.count('class="share"') == 4
    assert sorted(shown.links[:2]) == ["worker-0.log", "worker-1.log"] and "trace.json" in shown.links
    assert "script" not in shown.tags and "img" not in shown.tags  # nothing runs, nothing is fetched
    assert "src=" not in text and "@import" not in text and "url(" not in text


def test_a_record_s_markup_is_shown_as_text():
    data = record(message="<script>alert(1)</script>", run_id='"><script>x</script>')
    data["plans"][0]["argv"] = ["python3", "<img src=x onerror=alert(1)>"]
    data["attempts"][0]["tasks"] = {"<b>w</b>": task(log="<x>.log"), **data["attempts"][0]["tasks"]}
    _, text = render(data)
    shown = Page(text)
    assert "script" not in shown.tags and "b" not in shown.tags and "img" not in shown.tags, shown.tags
    assert "ValueError: <script>alert('x')</script> & <b>bold</b>" in " ".join(shown.text)
    assert "<img src=x onerror=alert(1)>" in " ".join(shown.text)
    assert "<x>.log" not in shown.links  # only a plain file of the run's folder is linked


def test_figures_it_does_not_know_are_shown_as_tables_and_those_missing_are_left_out():
    data = record()
    data["costs"]["lost_by_cause_s"] = {"start-up": 1.25, "wasted progress": 3.0, "restart overhead": 0.5}
    data["costs"]["per_attempt"] = [{"attempt": 0, "start-up": 1.25}, {"attempt": 1, "start-up": 0.75}]
    data["attempts"][0]["lost_s"] = {"stall": 2.0, "after last step": 0.5}
    told, text = render(data)
    words = Page(text).words
    names = dict(told.breakdowns)
    assert names["lost_by_cause_s"].rows == (("start-up", "1.25"), ("wasted progress", "3"),
                                             ("restart overhead", "0.5"))
    assert names["per_attempt"].columns == ("attempt", "start-up")
    assert "lost_s.stall" in told.attempts.columns and "wasted progress" in words
    bare = record()
    del bare["costs"]
    for attempt in bare["attempts"]:
        for key in ("progress", "time_lost_s", "ready_at"):
            attempt.pop(key)
    told, text = render(bare)
    assert told.goodput is None and "unknown" in Page(text).words


def test_the_trace_has_an_event_per_task_attempt():
    told = story.story(record())
    events = json.loads(trace.trace_json(told))["traceEvents"]
    attempts = [(e["args"]["host"], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"]
    assert sorted(attempts) == [("h1", "attempt 1", 500000, 7500000), ("h1", "attempt 2", 10000000, 9000000),
                                ("h2", "attempt 1", 500000, 7400000), ("h3", "attempt 2", 10000000, 9400000)]
    restarts = [e for e in events if e.get("cat") == "restart"]
    assert [(e["name"], e["args"]["task"]) for e in restarts] == [("attempt 1 failed: program-error", "worker:1")]
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"worker:0", "worker:1"}


@pytest.mark.parametrize("change", [
    lambda d: d.update(attempts="many"),
    lambda d: d["attempts"][0].update(tasks=["x"], started_at="yesterday", attempt="0"),
    lambda d: d["attempts"][0]["tasks"]["worker:0"].update(started_at=None, ended_at=12, busy={"share": "all"}),
    lambda d: d["attempts"][1]["tasks"]["worker:1"].update(started_at="9" * 5000, progress=[1]),
    lambda d: d.update(costs={"goodput": 7, "wall_s": 1e300, "left_out": [None, {"host": ["x"]}],
                              "deep": {"a": {"b": {"c": 1}}}}),
    lambda d: d.update(plans=[None, {"argv": "python3 x"}, {"name": 5, "argv": [1, None]}], options=[]),
])
def test_a_record_not_as_a_launch_writes_it_still_makes_a_page(change):
    data = record()
    change(data)
    told, text = render(copy.deepcopy(data))
    Page(text)
    json.loads(trace.trace_json(told))


def test_a_huge_run_is_drawn_in_part_and_says_so():
    data = record()
    data["attempts"][1]["tasks"] = {f"worker:{i}": task("h1", 10, 11, 19, code=0) for i in range(story.MAX_TASKS + 200)}
    data["attempts"][0]["detail"] = "x" * 100_000
    told, text = render(data)
    assert len(told.tasks) == story.MAX_TASKS
    assert f"{story.MAX_TASKS + 200} tasks: the first {story.MAX_TASKS} drawn" in Page(text).words
    assert len(told.restarts[0].detail) == story.MAX_TEXT
    assert len(text) < 2_000_000


def samples_of(busy_by_second):
    """samples.jsonl's lines as the supervisor writes them, one every 2 s from the run's start."""
    start = story.epoch(T0)
    return [{"at": start + t, "attempt": 0 if t < 10 else 1, "hosts": 2, "steps": {}, "steps_per_s": None,
             "busy": busy, "costs": {}} for t, busy in busy_by_second]


def test_each_task_s_busy_share_over_time_is_drawn_from_the_samples_the_slow_task_darkest():
    lines = samples_of([(t, {"worker:0": 0.3, "worker:1": 0.9}) for t in range(0, 20, 2)])
    lines[3]["busy"] = {"worker:0": "x", "worker:1": 2, "<b>": 0.5}  # anyone's text: skipped
    lines.append("not a sample")
    told = story.story(record(), None, lines)
    rows = dict(told.busy_over_time)
    assert list(rows) == ["worker:0", "worker:1"]
    assert [(c.start, c.end) for c in rows["worker:1"]][:3] == [(0, 2), (2, 4), (4, 6)]
    assert len(rows["worker:1"]) == 9 and {c.share for c in rows["worker:1"]} == {0.9}
    text = page.render(told, {}, None)
    busy = text[text.index('<h2 id="busy">'):text.index('<h2 id="costs">')]
    assert busy.count('class="share-row"') == 2 and 'class="share"' not in busy  # rows over time, not per attempt
    assert ">worker:1 90%</text>" in busy and ">worker:0 30%</text>" in busy
    assert busy.count("<rect ") == 18 and f'fill="{svg._heat(0.9)}"' in busy  # the slow task's cells: the deepest


def test_many_samples_are_merged_into_a_bounded_row_and_a_run_without_samples_keeps_the_per_attempt_strip():
    lines = samples_of([(t / 10, {"worker:0": 0.2 if t < 100 else 0.8}) for t in range(200)])
    told = story.story(record(), None, lines)
    (name, cells), (_, none) = told.busy_over_time
    assert name == "worker:0" and len(cells) == 200  # one cell a sample while they fit
    assert none == () and cells[0].share == pytest.approx(0.2) and cells[-1].share == pytest.approx(0.8)
    many = samples_of([(t, {"worker:0": 0.5}) for t in range(5000)])
    (_, cells), _ = story.story(record(), None, many).busy_over_time
    assert len(cells) <= busy.MAX_COLUMNS
    assert sum(c.end - c.start for c in cells) == pytest.approx(5000 - 1 + 2)
    _, text = render(record())
    assert 'class="share"' in text and 'class="share-row"' not in text


def test_the_launch_s_command_line_is_shown_as_recorded_and_not_among_the_settings():
    data = record(options={"grace_period": 10.0, "command_line": ["mgpu", "launch", "--env", "A=***", "--",
                                                                  "python3", "<b>t.py</b>"]})
    told, text = render(data)
    assert told.launched_with == "mgpu launch --env 'A=***' -- python3 '<b>t.py</b>'"
    assert "<pre id=\"launched-with\">mgpu launch --env 'A=***' -- python3 '&lt;b&gt;t.py&lt;/b&gt;'</pre>" in \
        text.replace("&#x27;", "'")
    assert [name for name, _ in told.settings.rows] == ["grace_period"]
    assert story.story(record(options={"command_line": "mgpu launch"})).launched_with == ""  # not a list: left out


def test_the_time_lost_is_a_table_by_cause_as_the_docs_name_them_for_the_run_and_each_attempt():
    from launcher.supervise.lost_time import CATEGORIES

    data = record()
    data["costs"].update(wall_s=20.0, time_lost_s=7.5, new_steps_s=12.5, goodput=0.625,
                         lost_s={"start_up": 1.5, "redone": 3.0, "after_last_step": 0.5, "stalled": 0.0,
                                 "restart": 2.0, "finish": 0.5})
    data["attempts"][0].update(time_lost_s=2.0, new_steps_s=5.5, restart_before_s=0.0,
                               lost_s={"start_up": 1.5, "redone": 0.0, "after_last_step": 0.5, "stalled": 0.0,
                                       "finish": 0.0})
    data["attempts"][1].update(time_lost_s=3.5, new_steps_s=7.0, restart_before_s=2.0,
                               lost_s={"start_up": 0.0, "redone": 3.0, "after_last_step": 0.0, "stalled": "x",
                                       "finish": 0.5})
    told, text = render(data)
    rows = {row[0]: row for row in told.lost.rows}
    assert told.lost.columns == ("cause", "what it counts", "run", "share of the wall time", "attempt 1", "attempt 2")
    assert list(rows) == [*CATEGORIES, "time lost", "new steps"]
    assert rows["redone"][2:] == ("3.00 s", "15.0%", "0.00 s", "3.00 s")
    assert rows["restart"][2:] == ("2.00 s", "10.0%", "0.00 s", "2.00 s")  # an attempt's: the time before it
    assert rows["stalled"][-1] == "-" and rows["new steps"][2:4] == ("12.50 s", "62.5%")
    docs = (pathlib.Path(__file__).parents[2] / "docs" / "output.md").read_text()
    for cause in CATEGORIES:  # named as the docs name them
        assert f"| `{cause}` |" in docs
    shown = text[text.index('<h2 id="costs">'):text.index('<h2 id="checks">')]
    words = Page(shown).words
    assert "goodput 62.5% the share of the wall time spent on new steps" in words
    assert "redone steps at or below the best step reached before 3.00 s 15.0% 0.00 s 3.00 s" in words
    assert shown.count("<rect ") == 6  # the wall time cut: new steps and the five causes that took time
