"""Lines redrawn with carriage returns, and the progress protocol: bounded console, complete logs."""

import dataclasses
import os
import pathlib
import pty
import re
import subprocess
import sys
import threading
import time

import pytest

from launching import start_mgpu
from supervisor_helpers import make_plans, supervise_plans
from launcher import protocol
from launcher.supervise.live import LiveLines, ProgressMeter, latest_redraw

pytestmark = pytest.mark.timeout(120)

REDRAW_TASK = str(pathlib.Path(__file__).resolve().parent / "redraw_task.py")
REDRAWS = 2000


def every_redraw_in_order(log: str) -> bool:
    """Every byte of the redrawn line reached the log (read as bytes: text mode turns \\r into \\n)."""
    return re.findall(r"\rprogress (\d+)/", log) == [str(i) for i in range(1, REDRAWS + 1)]


def test_redrawn_line_not_on_a_terminal_gives_a_few_plain_lines_and_a_complete_log(run_id, tmp_path):
    plans = [dataclasses.replace(plan, argv=(sys.executable, REDRAW_TASK, str(REDRAWS)))
             for plan in make_plans(run_id, [], workers=1)]
    started = time.monotonic()
    result = supervise_plans(plans, run_id, tmp_path)
    elapsed = time.monotonic() - started
    assert result.error is None, result.console
    shown = [line for line in result.console.splitlines() if line.startswith("[worker:0] ")]
    # The first redraw at once, then at most one line per 10 s, then the line's final state, and "done".
    assert shown[0].startswith("[worker:0] progress ") and shown[-2:] == [
        f"[worker:0] progress {REDRAWS}/{REDRAWS}", "[worker:0] done"]
    assert len(shown) <= 1 + elapsed // 10 + 2, (len(shown), elapsed)
    assert "\r" not in result.console
    assert every_redraw_in_order((result.run_dir / "worker-0.log").read_bytes().decode())


def read_all(fd, into):
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            return
        if not data:
            return
        into.append(data)


def test_redrawn_line_on_a_terminal_is_repainted_in_place_at_most_once_a_second(run_id, tmp_path):
    master, slave = pty.openpty()
    received = []
    reader = threading.Thread(target=read_all, args=(master, received), daemon=True)
    reader.start()
    started = time.monotonic()
    proc = start_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), "--",
                      sys.executable, REDRAW_TASK, str(REDRAWS),
                      stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    try:
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    elapsed = time.monotonic() - started
    reader.join(10)
    os.close(master)
    console = b"".join(received).decode("utf-8", "replace")
    repaints = re.findall(r"\[worker:0\] progress (\d+)/", console)
    assert 1 <= len(repaints) <= elapsed + 2, (len(repaints), elapsed)
    assert repaints[-1] == str(REDRAWS) and "\x1b[1A\x1b[J" in console
    assert "[worker:0] done" in console
    assert every_redraw_in_order((tmp_path / "runs" / run_id / "worker-0.log").read_bytes().decode())


def test_live_lines_are_rate_limited_and_end_as_ordinary_lines():
    live = LiveLines(terminal=False, interval=10.0)
    live.update("w0", "[w0] 1/9")
    assert live.render([], now=100.0) == "[w0] 1/9\n"
    live.update("w0", "[w0] 5/9")
    assert live.next_due(105.0) == pytest.approx(5.0)
    assert live.render(["[w1] hello\n"], now=105.0) == "[w1] hello\n"
    assert live.render([], now=110.0) == "[w0] 5/9\n"
    live.update("w0", "[w0] 8/9")
    assert live.remove("w0") == "[w0] 8/9"  # never shown: the console writes it as a line
    assert live.next_due(200.0) is None
    terminal = LiveLines(terminal=True, interval=1.0, width=80)
    terminal.update("w0", "[w0] 1/9")
    assert terminal.render([], now=0.0) == "[w0] 1/9\n"
    terminal.update("w0", "[w0] 2/9")
    assert terminal.render(["[w1] hello\n"], now=0.5) == "\x1b[1A\x1b[J[w1] hello\n[w0] 1/9\n"
    assert terminal.render([], now=1.0) == "\x1b[1A\x1b[J[w0] 2/9\n"
    assert terminal.remove("w0") == "[w0] 2/9"  # its block line goes away: the console prints it
    assert terminal.render(["[w0] 2/9\n"], now=1.5) == "\x1b[1A\x1b[J[w0] 2/9\n"
    assert latest_redraw("\r 1/3 [=  ]\r 2/3 [== ]\r") == " 2/3 [== ]"
    assert latest_redraw("\r 1/3 [=  ]\b\b\b\b\b\b\b\b\b\b\b") == " 1/3 [=  ]"  # Keras erases with backspaces


def test_progress_lines_render_as_a_bar_with_step_rate_and_eta():
    meter = ProgressMeter(terminal=False, width=0)
    assert meter.render("loss 0.3", 11) is None
    meter.render(protocol.progress_line(100, 1000), 11, now=0.0)
    bar = meter.render(protocol.progress_line(300, 1000), 11, now=10.0)
    assert "300/1000" in bar and "20.00 steps/s" in bar and "<00:35" in bar and "30%" in bar
    assert protocol.parse_progress("MGPU_PROGRESS 3/x") is None


def test_a_complete_progress_bar_stays_before_the_lines_after_it(run_id, tmp_path):
    script = ("import time\n"
              "for step in (1, 2, 3):\n"
              f"    print('{protocol.PROGRESS_PREFIX}%d/3' % step, flush=True); time.sleep(0.2)\n"
              "print('done step=3', flush=True)\n"
              "time.sleep(1)\n")
    plans = [dataclasses.replace(plan, argv=(sys.executable, "-c", script))
             for plan in make_plans(run_id, [], workers=1)]
    result = supervise_plans(plans, run_id, tmp_path)
    assert result.error is None, result.console
    shown = [line for line in result.console.splitlines() if line.startswith("[worker:0] ")]
    assert re.match(r"\[worker:0\] 100%\|#+\| 3/3 ", shown[-2]), shown
    assert shown[-1] == "[worker:0] done step=3"
