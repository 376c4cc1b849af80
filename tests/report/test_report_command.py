"""`mgpu report` on run folders written by hand: where the page and the trace go, what their links
are, and the one line and exit 2 for what cannot be read or written."""

import json
import os
import socket

from launcher.report import files


def write_run(log_dir, run_id="20260102-030405-abc"):
    folder = log_dir / run_id
    folder.mkdir(parents=True, mode=0o700)
    tasks = {"worker:0": {"host": "h1", "log": "worker-0.log", "started_at": "2026-01-02T03:04:06+00:00",
                          "ended_at": "2026-01-02T03:04:09+00:00", "exit_code": 0}}
    (folder / "run.json").write_text(json.dumps({
        "run_id": run_id, "status": "succeeded", "started_at": "2026-01-02T03:04:05+00:00",
        "ended_at": "2026-01-02T03:04:10+00:00", "supervisor_host": socket.gethostname(),
        "attempts": [{"attempt": 0, "started_at": "2026-01-02T03:04:05.5+00:00", "outcome": "succeeded",
                      "tasks": tasks}],
        "plans": [{"name": "worker:0", "type": "worker", "index": 0, "host": "h1", "argv": ["python3", "t.py"]}]}))
    (folder / "worker-0.log").write_text("hello\n")
    return folder


def test_the_page_and_the_trace_go_into_the_run_s_folder_with_links_beside_them(tmp_path, mgpu):
    folder = write_run(tmp_path)
    done = mgpu("report", "last", "--log-dir", str(tmp_path))
    assert done.exit_code == 0, done.stderr
    assert done.stdout.strip() == (f"mgpu: report of run {folder.name}: {folder / 'report.html'} "
                                   f"(its timeline for Perfetto: {folder / 'trace.json'})")
    text = (folder / "report.html").read_text()
    assert '<a href="worker-0.log">worker:0</a>' in text and '<a href="trace.json" id="trace">' in text
    assert [e["name"] for e in json.loads((folder / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"] \
        == ["attempt 1"]
    assert oct((folder / "report.html").stat().st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(folder)) == ["report.html", "run.json", "trace.json", "worker-0.log"]


def test_a_link_in_the_run_s_folder_is_replaced_not_followed(tmp_path, mgpu):
    folder = write_run(tmp_path / "runs")
    elsewhere = tmp_path / "elsewhere.html"
    elsewhere.write_text("untouched")
    (folder / "report.html").symlink_to(elsewhere)
    assert mgpu("report", "last", "--log-dir", str(tmp_path / "runs")).exit_code == 0
    assert elsewhere.read_text() == "untouched"
    assert not (folder / "report.html").is_symlink() and "<!DOCTYPE html>" in (folder / "report.html").read_text()


def test_with_o_the_trace_is_beside_the_page_and_the_logs_are_linked_where_they_are(tmp_path, mgpu):
    folder = write_run(tmp_path / "runs")
    done = mgpu("report", folder.name[:10], "--log-dir", str(tmp_path / "runs"), "-o", str(tmp_path / "run.html"))
    assert done.exit_code == 0, done.stderr
    assert files.trace_path(tmp_path / "run.html") == tmp_path / "run.trace.json"
    text = (tmp_path / "run.html").read_text()
    assert f'<a href="{(folder / "worker-0.log").as_uri()}">worker:0</a>' in text
    assert '<a href="run.trace.json" id="trace">' in text and (tmp_path / "run.trace.json").exists()
    assert not (folder / "report.html").exists()


def test_what_cannot_be_read_or_written_is_one_line_and_exit_2(tmp_path, mgpu):
    write_run(tmp_path / "runs")
    done = mgpu("report", "last", "--log-dir", str(tmp_path / "runs"), "-o", str(tmp_path / "no" / "such" / "r.html"))
    assert done.exit_code == 2
    assert done.stderr.startswith(f"mgpu: error: cannot write {tmp_path / 'no' / 'such'}") and \
        done.stderr.count("\n") == 1, done.stderr
    done = mgpu("report", "nope", "--log-dir", str(tmp_path / "runs"))
    assert done.exit_code == 2 and done.stderr.startswith("mgpu: error: no run 'nope' of yours") \
        and done.stderr.count("\n") == 1


def test_the_host_checks_table_is_shown_from_the_check_s_json_in_the_run_s_folder(tmp_path, mgpu):
    folder = write_run(tmp_path)
    rows = [{"host": "h1", "tasks": ["worker:0"], "ssh": "ok", "python": "3.11.7", "tensorflow": "-", "tf_keras": "-",
             "ports": "ok", "gpus": "0", "ok": False, "problems": ["port 2222 in use", "<b>no GPU</b>"],
             "speed": {"host": "h1", "matmul_gflops": 12.5}}]
    (folder / "checks.json").write_text(json.dumps({"hosts": rows, "unreachable": [], "slow_hosts": []}))
    assert mgpu("report", "last", "--log-dir", str(tmp_path)).exit_code == 0
    text = (folder / "report.html").read_text()
    checks = text[text.index('<h2 id="checks">'):text.index('<h2 id="logs">')]
    assert "<td>h1</td><td>worker:0</td><td>ok</td><td>3.11.7</td>" in checks
    assert '<td class="detail">port 2222 in use; &lt;b&gt;no GPU&lt;/b&gt;</td>' in checks
    assert "<th>speed.matmul_gflops</th>" in checks and "<td>12.5</td>" in checks


def test_a_stalled_attempt_s_folder_is_linked_with_the_flight_recorder_s_verdict(tmp_path, mgpu):
    folder = write_run(tmp_path / "runs")
    record = json.loads((folder / "run.json").read_text())
    stalled = {**record["attempts"][0], "attempt": 1, "outcome": "stalled", "flight_recorder": {"dumps": 2, "missing": [
        {"sequence": 9, "collective": "gloo:all_reduce<b>", "group": "0:default_pg", "ranks": [1],
         "tasks": ["worker:1"]}]}}
    record["attempts"] = [{**record["attempts"][0], "outcome": "stalled"}, stalled]
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "stall-1").mkdir()
    (folder / "stall-0").symlink_to(tmp_path)  # not the supervisor's folder: not linked
    assert mgpu("report", "last", "--log-dir", str(tmp_path / "runs")).exit_code == 0
    text = (folder / "report.html").read_text()
    # The console's count (attempt 2) beside the folder named by run.json's (stall-1).
    assert 'attempt 2: <a href="stall-1/">stall-1/</a>' in text and 'href="stall-0/"' not in text
    assert "flight recorder: worker:1 did not join gloo:all_reduce&lt;b&gt; #9" in text
    assert mgpu("report", "last", "--log-dir", str(tmp_path / "runs"), "-o", str(tmp_path / "r.html")).exit_code == 0
    assert f'<a href="{(folder / "stall-1").as_uri()}/">stall-1/</a>' in (tmp_path / "r.html").read_text()


def test_the_busy_shares_over_time_come_from_the_end_of_the_run_s_samples(tmp_path, mgpu):
    folder = write_run(tmp_path)
    start = 1767323045.0  # the run's start, 2026-01-02T03:04:05Z
    lines = [json.dumps({"at": start + t, "busy": {"worker:0": 0.75}}) for t in (1, 3, 5, 7)]
    with open(folder / "samples.jsonl", "w") as f:  # a file far larger than a launch writes: its end is read
        f.write(("x" * 1000 + "\n") * (files.MAX_SAMPLES_BYTES // 1000) + "\n".join(lines) + "\n")
    assert mgpu("report", "last", "--log-dir", str(tmp_path)).exit_code == 0
    text = (folder / "report.html").read_text()
    busy = text[text.index('<h2 id="busy">'):text.index('<h2 id="costs">')]
    assert busy.count("<rect ") == 4 and ">worker:0 75%</text>" in busy
