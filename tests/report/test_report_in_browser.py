"""`mgpu report` of a real run with one restart, opened in headless Chromium: the page as the browser
builds it shows every task, the failed attempt's cause (its error text, markup and all, as text) and
the goodput, and the launch's command line without the secrets its --env and --notify carry; the
trace parses and has an event per task and attempt. The screenshot is kept in the
test's temporary folder."""

import json
import os
import re
import shutil
import signal
import subprocess

import pytest

from launching import run_mgpu
from needs import missing

pytestmark = pytest.mark.timeout(180)

SECRET = "hunter2-b9d41c"  # what --env and --notify carry: never in run.json or the page

# worker:1 fails at its third step in the first attempt, its error text holding markup.
PROGRAM = """\
import os, sys
attempt, index = os.environ["MGPU_ATTEMPT"], os.environ["MGPU_TASK_INDEX"]
for step in range(1, 5):
    print(f"MGPU_PROGRESS {step}/4", flush=True)
    if attempt == "0" and index == "1" and step == 3:
        raise ValueError("<script>document.title='pwned'</script> at step 3")
"""


def chromium(*args, folder, timeout=90):
    """Headless Chromium run to its end (its whole process group stopped if it is not)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        missing("needs chromium (.ci/run installs Debian's)")
    proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             f"--user-data-dir={folder / 'chromium-profile'}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "HOME": str(folder)})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"chromium did not finish in {timeout} s") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind (its zygotes)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, proc.returncode
    return out


def test_the_report_of_a_run_with_a_restart_in_chromium(tmp_path):
    program = tmp_path / "steps.py"
    program.write_text(PROGRAM)
    logs = tmp_path / "runs"
    launched = run_mgpu("launch", "--local", "2", "--log-dir", str(logs), "--max-restarts", "1",
                        "--env", f"REPORT_TOKEN={SECRET}", "--notify", f"cat >/dev/null # {SECRET}", "--",
                        "python3", str(program), timeout=120)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    made = run_mgpu("report", "last", "--log-dir", str(logs), timeout=60)
    assert made.returncode == 0, made.stderr
    (run_dir,) = logs.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]

    dom = chromium("--dump-dom", (run_dir / "report.html").as_uri(), folder=tmp_path)
    chromium("--screenshot=" + str(tmp_path / "report.png"), "--window-size=1100,1300",
             (run_dir / "report.html").as_uri(), folder=tmp_path)
    assert (tmp_path / "report.png").stat().st_size > 10_000

    assert "<script" not in dom and "pwned" not in re.search(r"<title>(.*?)</title>", dom).group(1)
    restart = re.search(r'<tr class="restart">(.*?)</tr>', dom, re.S).group(1)
    assert '<td class="cause">program-error</td><td>worker:1</td>' in restart
    assert "ValueError: &lt;script&gt;document.title='pwned'&lt;/script&gt; at step 3" in restart
    for name in ("worker:0", "worker:1"):
        assert dom.count(f'data-task="{name}"') >= 2, name  # a bar in each attempt
        assert re.search(rf'<a href="{name.replace(":", "-")}.log">{name}</a>', dom), name
    goodput = f"{100 * record['costs']['goodput']:.1f}%"
    assert f'<span class="goodput" id="goodput">{goodput}</span>' in dom

    # The launch's command line, as given but for its secrets, which reach neither run.json nor the page.
    assert record["options"]["command_line"][:6] == ["mgpu", "launch", "--local", "2", "--log-dir", str(logs)]
    launched_with = re.search(r'<pre id="launched-with">(.*?)</pre>', dom, re.S).group(1)
    assert "--env 'REPORT_TOKEN=***' --notify '***' -- python3 " in launched_with, launched_with
    assert not (run_dir / "checks.json").exists()  # a run on this machine alone checks no hosts
    for name in ("run.json", "report.html", "trace.json"):
        assert SECRET not in (run_dir / name).read_text(), name
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    spans = sorted((e["name"], e["tid"]) for e in events if e["ph"] == "X")
    assert spans == [("attempt 1", 1), ("attempt 1", 2), ("attempt 2", 1), ("attempt 2", 2)]
