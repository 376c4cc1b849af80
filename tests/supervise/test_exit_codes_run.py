"""Exit codes with a meaning, in real runs: one task on this machine, a one-line Python program."""

import json
import re
import sys

import pytest

from launcher.exit_codes import DEFAULTS, parse_text
from launching import run_mgpu
from supervisor_helpers import make_plans, supervise_plans

pytestmark = pytest.mark.timeout(60)


def test_an_exit_code_ruled_fail_stops_the_run_without_a_restart(run_id, tmp_path):
    log_dir = tmp_path / "runs"
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(log_dir), "--max-restarts", "3",
                    "--exit-codes", "3=fail", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 1, done.stderr
    assert ("stopped restarting: worker:0 exited with code 3, which means: do not restart "
            "(rule 3=fail, from --exit-codes)") in done.stderr
    run = json.loads((log_dir / run_id / "run.json").read_text())
    assert len(run["attempts"]) == 1
    assert run["attempts"][0]["rule"] == {"code": 3, "action": "fail", "source": "--exit-codes"}
    assert run["options"]["exit_codes"] == [{"code": 3, "action": "fail", "source": "--exit-codes"},
                                            {"code": 42, "action": "restart-free", "source": "default"}]


def test_a_restart_free_exit_code_restarts_without_a_restart_to_spare(run_id, tmp_path):
    plans = make_plans(run_id, [], workers=1)
    code = "import os, sys\nsys.exit(75 if os.environ['MGPU_ATTEMPT'] == '0' else 0)"
    plans[0] = type(plans[0])(**{**plans[0].__dict__, "argv": (sys.executable, "-c", code)})
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=0,
                             exit_codes=DEFAULTS.over(parse_text("75=restart-free")))
    assert result.error is None, result.error
    assert "restarting all tasks after exit code 75 (rule 75=restart-free, from --exit-codes) (1 of at most 100)" \
        in result.console
    closing = result.console.splitlines()[-1]
    assert re.search(r"1 restart \(worker:0 failed at \d\d:\d\d: exited with code 75 "
                     r"\(rule 75=restart-free, from --exit-codes\)\)", closing), closing
