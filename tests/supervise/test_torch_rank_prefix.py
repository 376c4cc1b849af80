"""A PyTorch program that fails after init_process_group: torch.distributed's excepthook writes
"[rankN]: " before every line of the report, and mgpu reads through it. The failure summary, the
attempt's line and run.json's `detail` name the exception and the user's frame, as for any other
program (tests/programs/torch_resume.py: pytorch/examples' imagenet resuming from a file that is no
checkpoint). The diagnosis of the same lines, captured, is in test_program_wording.py."""

import json
import re
import sys

import pytest

import needs
from launching import REPO, run_mgpu

pytestmark = pytest.mark.timeout(240)

PROGRAM = str(REPO / "tests" / "programs" / "torch_resume.py")
# The user's deepest frame: torch.load's own frames are a library's.
FRAME = re.compile(r'at \S*/tests/programs/torch_resume\.py:19 in main_worker: '
                   r'checkpoint = torch\.load\(resume, map_location="cpu"\)')
EXCEPTION = re.compile(r"^[\w.]*Error: ")


def test_a_torch_traceback_with_rank_prefixes_is_summed_up_by_its_exception(tmp_path, run_id):
    needs.require("torch")
    bad = tmp_path / "checkpoint.pth.tar"
    bad.write_text("not a checkpoint\n")
    runs = tmp_path / "runs"
    result = run_mgpu("launch", "--local", "2", "--run-id", run_id, "--log-dir", str(runs),
                      "--", sys.executable, PROGRAM, str(bad), timeout=180)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # The logs keep the lines as torch wrote them.
    log = (runs / run_id / "worker-0.log").read_text()
    assert "[rank0]: Traceback (most recent call last):" in log
    # The summary: the task, then its exception and frame, without the prefix.
    summary = result.stderr[result.stderr.index("mgpu: error: "):].splitlines()
    assert re.fullmatch(r"mgpu: error: worker:[01] on \S+ exited with code 1", summary[0]), summary
    assert EXCEPTION.match(summary[1].strip()) and FRAME.fullmatch(summary[2].strip()), summary
    assert not any("[rank" in line for line in summary), summary
    attempt = next(line for line in result.stdout.splitlines() + result.stderr.splitlines()
                   if line.startswith("[mgpu] attempt 1 failed: "))
    assert "[rank" not in attempt and FRAME.search(attempt), attempt
    record = json.loads((runs / run_id / "run.json").read_text())["attempts"][-1]
    assert record["cause"] == "program-error" and EXCEPTION.match(record["detail"]), record
    assert FRAME.search(record["detail"]), record["detail"]
