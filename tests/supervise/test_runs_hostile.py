"""`mgpu status`, `logs` and `attach` on run folders that a launch did not write as they are: a
folder open to others, FIFOs and links where files should be, control characters, and run.json
files of every wrong shape. Each is refused in one line (or listed as unreadable), the other runs
are still listed, nothing blocks and nothing reaches the terminal raw."""

import json
import os
import socket

import pytest
from click.testing import CliRunner

from launcher.cli.main import cli
from launching import run_mgpu

HOST = socket.gethostname()
ESC = "\x1b"


def write_run(log_dir, run_id, record, mode=0o700):
    folder = log_dir / run_id
    folder.mkdir(parents=True)
    folder.chmod(mode)
    text = record if isinstance(record, (str, bytes)) else json.dumps(record)
    (folder / "run.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


def good(run_id, **more):
    return {"run_id": run_id, "status": "succeeded", "started_at": "2026-01-01T00:00:00", "exit_code": 0,
            "supervisor_host": HOST, "plans": [{"type": "worker", "index": 0, "host": "localhost"}], **more}


def with_task(run_id, **task):
    return good(run_id, attempts=[{"attempt": 0, "tasks": {"worker:0": {"host": "localhost", "pid": 1, **task}}}])


# Each is what some field of a real run.json could be made to hold; all of them broke the listing.
MALFORMED = {
    "a-list": [1, 2],
    "tasks-a-list": good("x", attempts=[{"tasks": []}]),
    "task-a-string": good("x", attempts=[{"tasks": {"worker:0": "x"}}]),
    "attempts-an-object": good("x", attempts={"0": {}}),
    "attempts-a-string": good("x", attempts="abc"),
    "progress-a-string": with_task("x", progress="50%"),
    "step-a-string": with_task("x", progress={"step": "a", "total": 10}),
    "busy-a-list": with_task("x", busy=[1]),
    "share-a-string": with_task("x", busy={"share": "all"}),
    "plans-an-object": good("x", plans={"worker": 0}),
    "huge-step": with_task("x", progress={"step": 10 ** 30, "total": 10}),
    "huge-int": '{"run_id": "x", "exit_code": ' + "9" * 5000 + "}",
    "nan-eta": '{"run_id": "x", "attempts": [{"tasks": {"worker:0": {"progress": {"step": 1, "eta_s": NaN}}}}]}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "options-a-list": good("x", options=[1]),
}


def test_malformed_records_are_one_line_each_and_the_others_still_listed(tmp_path):
    write_run(tmp_path, "fine", good("fine"))
    for name, record in MALFORMED.items():
        write_run(tmp_path, name, record)
    big = write_run(tmp_path, "too-big", good("too-big"))
    os.truncate(big / "run.json", 33 << 20)  # sparse: reading it whole is what is refused
    listed = run_mgpu("status", "--log-dir", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert "internal error" not in listed.stderr + listed.stdout and listed.stderr == ""
    lines = listed.stdout.splitlines()
    assert len(lines) == 1 + 1 + len(MALFORMED) + 1, listed.stdout  # the header, then a line a run
    assert any(line.split()[:2] == ["fine", "succeeded"] for line in lines), listed.stdout
    for name in [*MALFORMED, "too-big"]:
        assert [line.split()[1] for line in lines if line.split()[0] == name] == ["unreadable"], (name, listed.stdout)
    assert "run.json is over 32 MiB" in listed.stdout and "run.json is nested too deeply" in listed.stdout
    assert "run.json.attempts[0].tasks is list, not an object" in listed.stdout
    as_json = json.loads(run_mgpu("status", "--log-dir", str(tmp_path), "--json").stdout)
    assert {run["run_id"]: run["state"] for run in as_json}["deep"] == "unreadable"
    runner = CliRunner()
    for name in [*MALFORMED, "too-big"]:
        for command in (["status", name], ["status", name, "--json"], ["logs", name], ["stop", name]):
            done = runner.invoke(cli, [*command, "--log-dir", str(tmp_path)])
            said = done.output
            assert done.exit_code == 2 and said.count("\n") == 1, (command, said)
            assert said.startswith(f"mgpu: error: run {name} cannot be read: "), (command, said)


def test_a_run_folder_open_to_others_is_listed_as_unreadable_and_not_read(tmp_path):
    folder = write_run(tmp_path, "open", with_task("open", last_line="fine"), mode=0o777)
    (folder / "worker-0.log").write_text("planted\n")
    listed = run_mgpu("status", "--log-dir", str(tmp_path))
    assert listed.returncode == 0 and "open  unreadable" in listed.stdout, listed.stdout
    assert "writable by others (mode 0777)" in listed.stdout
    for command in (["status", "open"], ["logs", "open", "--task", "worker:0"], ["attach", "open"]):
        done = run_mgpu(*command, "--log-dir", str(tmp_path))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "planted" not in done.stdout, done


def test_fifos_and_links_in_a_run_folder_are_refused_without_blocking(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    folder = write_run(tmp_path, "last-one", with_task("last-one"))
    os.mkfifo(folder / "console.log")
    os.symlink(secret, folder / "worker-0.log")
    # A FIFO nobody writes: open or read it and the command hangs (run_mgpu's timeout fails the test).
    for args in (["logs", "last"], ["logs", "last", "-f"]):
        done = run_mgpu(*args, "--log-dir", str(tmp_path), timeout=30)
        assert done.returncode == 2, done
        assert done.stderr == "mgpu: error: run last-one: console.log: not a regular file\n", done.stderr
    done = run_mgpu("logs", "last-one", "--task", "worker:0", "--log-dir", str(tmp_path), timeout=30)
    assert done.returncode == 2 and done.stderr == "mgpu: error: run last-one: worker-0.log: a link\n", done.stderr
    assert "secret" not in done.stdout
    os.symlink(folder, tmp_path / "linked")  # a link to a run is not a run
    assert "no run 'linked' of yours" in run_mgpu("status", "linked", "--log-dir", str(tmp_path)).stderr
    os.symlink(tmp_path / "secret-dir", tmp_path / "dangling")
    os.mkfifo(tmp_path / "fifo")  # a FIFO in the log dir itself is not a run either
    (tmp_path / "fifo-record").mkdir(mode=0o700)
    os.mkfifo(tmp_path / "fifo-record" / "run.json")  # a run whose record is a FIFO: listed, not waited on
    listed = run_mgpu("status", "--log-dir", str(tmp_path), timeout=30)
    assert listed.returncode == 0 and "linked" not in listed.stdout and "fifo " not in listed.stdout, listed
    assert "fifo-record  unreadable" in listed.stdout and "run.json: not a regular file" in listed.stdout, listed


def test_control_characters_are_shown_escaped_and_raw_only_on_request(tmp_path):
    forged = f"{ESC}]0;owned{chr(7)}{ESC}[2J\r[mgpu] done: 2 tasks succeeded"
    record = {**with_task("ctl", last_line=forged), "message": f"failed{ESC}[31m", "status": "failed", "exit_code": 1}
    record["attempts"][0]["tasks"]["worker:0"]["host"] = f"h{ESC}[1A"
    folder = write_run(tmp_path, "ctl", record)
    (folder / "worker-0.log").write_bytes(f"line one\n{forged}\n\u202eevil\t".encode() + b"\xff\n")
    shown = run_mgpu("status", "ctl", "--log-dir", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert ESC not in shown.stdout and "\r" not in shown.stdout and "\\x1b]0;owned\\x07\\x1b[2J\\x0d" in shown.stdout
    assert "failed\\x1b[31m" in shown.stdout and "h\\x1b[1A" in shown.stdout
    logs = run_mgpu("logs", "ctl", "--task", "worker:0", "--log-dir", str(tmp_path), text=False)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == ("line one\n\\x1b]0;owned\\x07\\x1b[2J\\x0d[mgpu] done: 2 tasks succeeded\n"
                           "\\u202eevil\t\ufffd\n").encode()
    raw = run_mgpu("logs", "ctl", "--task", "worker:0", "--raw", "--log-dir", str(tmp_path), text=False)
    assert raw.stdout == (folder / "worker-0.log").read_bytes()


@pytest.mark.parametrize("name", ["status", "logs", "attach", "stop"])
def test_a_run_id_with_control_characters_is_shown_escaped(tmp_path, name):
    run_id = f"r{ESC}[2J"
    write_run(tmp_path, run_id, good(run_id, status="failed"))
    done = run_mgpu(name, *([run_id] if name != "status" else []), "--log-dir", str(tmp_path))
    assert ESC not in done.stdout + done.stderr and "r\\x1b[2J" in done.stdout + done.stderr, done
