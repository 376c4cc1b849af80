"""The output path end to end, through the real `mgpu launch --local 1`: hostile lines, long
lines, and a console read late."""

import dataclasses
import json
import subprocess
import sys

import pytest

from launcher.supervise import supervisor
from launching import start_mgpu, wait_for
from supervisor_helpers import make_plans, supervise_plans

pytestmark = pytest.mark.timeout(180)

# Longer than any wait for output the launcher has (its tasks' output to reach end of file), so a
# launcher that gave up on its console after one would be seen.
LATE_READER_WAIT = supervisor.DRAIN_TIMEOUT + 2.0


def launch(run_id, tmp_path, *program, stdout=None):
    out = stdout if stdout is not None else open(tmp_path / "mgpu.out", "w")
    return start_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                      "--grace-period", "1", "--", *program,
                      stdin=subprocess.DEVNULL, stdout=out, stderr=open(tmp_path / "mgpu.err", "w"))


def finish(proc, timeout=120):
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_hostile_progress_line_stops_neither_the_log_nor_the_console(run_id, tmp_path):
    script = tmp_path / "p.sh"
    script.write_text('echo MGPU_TASK_READY\necho "MGPU_PROGRESS \u00b2/3"\necho "MGPU_PROGRESS 5/'
                      + "9" * 400 + '"\nseq 20000\n')
    proc = launch(run_id, tmp_path, "sh", str(script))
    assert finish(proc) == 0, (tmp_path / "mgpu.err").read_text()
    log = (tmp_path / "runs" / run_id / "worker-0.log").read_bytes()
    expected = ("MGPU_TASK_READY\nMGPU_PROGRESS \u00b2/3\nMGPU_PROGRESS 5/" + "9" * 400 + "\n").encode()
    assert log == expected + b"".join(b"%d\n" % i for i in range(1, 20001))
    console = (tmp_path / "mgpu.out").read_text()
    assert "[worker:0] 20000\n" in console and "[mgpu] done: 1 tasks succeeded" in console
    assert "internal error" not in console


def test_a_long_line_reaches_the_log_whole_beside_the_other_stream(run_id, tmp_path):
    program = ("import json, sys, threading\n"
               "def noise():\n"
               "    for i in range(3000):\n"
               "        sys.stderr.write(f'stderr {i}\\n'); sys.stderr.flush()\n"
               "t = threading.Thread(target=noise); t.start()\n"
               "for n in range(3):\n"
               "    sys.stdout.write(json.dumps({'n': n, 'values': list(range(40000))}) + '\\n'); sys.stdout.flush()\n"
               "t.join()\n")
    proc = launch(run_id, tmp_path, sys.executable, "-c", program)
    assert finish(proc) == 0, (tmp_path / "mgpu.err").read_text()
    lines = (tmp_path / "runs" / run_id / "worker-0.log").read_bytes().split(b"\n")
    documents = [json.loads(line) for line in lines if line.startswith(b"{")]
    assert [d["n"] for d in documents] == [0, 1, 2] and all(len(d["values"]) == 40000 for d in documents)
    assert [line for line in lines if line.startswith(b"stderr")] == [b"stderr %d" % i for i in range(3000)]
    assert len(lines) == 3 + 3000 + 1  # nothing else: no piece of a long line on a line of its own


def test_mgpus_own_lines_reach_a_console_read_late(run_id, tmp_path):
    """`mgpu launch ... | (sleep 15; cat)`: the reader starts after the run has ended and the
    launcher has queued its closing line behind far more than the pipe holds."""
    proc = launch(run_id, tmp_path, "seq", "200000", stdout=subprocess.PIPE)  # 1.3 MB; a pipe holds 64 KiB
    run_json = tmp_path / "runs" / run_id / "run.json"

    def ended():
        try:
            return json.loads(run_json.read_text()).get("ended_at") is not None
        except (OSError, ValueError):
            return False

    try:
        wait_for(ended, 120, what="the run to end")
        # Nothing read yet: the launcher must wait for its console, however late the reader comes.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(LATE_READER_WAIT)
        console = proc.stdout.read()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = console.splitlines()
    assert lines[-1].startswith("[mgpu] done: 1 tasks succeeded"), lines[-3:]
    assert "[worker:0] 200000" in lines


def test_after_a_last_line_without_newline_a_restart_header_starts_its_own_line(run_id, tmp_path):
    program = "import os, sys; sys.stdout.write('partial'); sys.exit(0 if os.environ['MGPU_ATTEMPT'] == '1' else 3)"
    plan = dataclasses.replace(make_plans(run_id, [], workers=1)[0], argv=(sys.executable, "-c", program))
    result = supervise_plans([plan], run_id, tmp_path, max_restarts=1)
    assert result.error is None, result.console
    log = (result.run_dir / "worker-0.log").read_bytes()
    assert log.startswith(b"partial\n----- mgpu: attempt 2 started ") and log.endswith(b" -----\npartial")
