"""A restart's redone steps are counted: one real run of a plain Python program that reports its steps,
checkpoints, fails once and resumes from its checkpoint."""

import json
import sys

import pytest

from launcher.supervise.lost_time import told
from supervisor_helpers import make_plans, supervise_plans

pytestmark = pytest.mark.timeout(60)

# Checkpoints every 5 steps; the first attempt fails after step 9, the second resumes at 5 and
# redoes 6-9. The program notes when it began step 6 and ended step 9 on the second attempt: the
# redone work as it saw it, whatever the machine's speed.
PROGRAM = """
import json, os, sys, time
attempt = int(os.environ['MGPU_ATTEMPT'])
folder = sys.argv[1]
checkpoint = os.path.join(folder, 'checkpoint')
step = int(open(checkpoint).read()) if os.path.exists(checkpoint) else 0
marks = {}
while step < 12:
    if attempt == 1 and step == 5:
        marks['redo_from'] = time.time()
    time.sleep(0.25)
    step += 1
    print(f'MGPU_PROGRESS {step}/12', flush=True)
    if attempt == 1 and step == 9:
        marks['redo_to'] = time.time()
        with open(os.path.join(folder, 'marks.json'), 'w') as f:
            json.dump(marks, f)
    if step % 5 == 0:
        with open(checkpoint, 'w') as f:
            f.write(str(step))
    if attempt == 0 and step == 9:
        sys.exit(3)
"""


def test_the_steps_a_restart_redoes_are_counted_lost_and_told_as_run_json_says(run_id, tmp_path):
    plans = make_plans(run_id, [], workers=1)
    plans[0] = type(plans[0])(**{**plans[0].__dict__, "argv": (sys.executable, "-c", PROGRAM, str(tmp_path))})
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=1)
    assert result.error is None, result.error
    marks = json.loads((tmp_path / "marks.json").read_text())
    redone = marks["redo_to"] - marks["redo_from"]
    run = result.run
    first, second = run["attempts"]
    assert abs(second["lost_s"]["redone"] - redone) <= 0.5, (second, redone)
    assert first["lost_s"]["redone"] == 0
    costs = run["costs"]
    assert costs["restarts"] == 1
    assert costs["lost_s"]["redone"] == second["lost_s"]["redone"]
    assert costs["lost_s"]["restart"] > 0
    assert costs["time_lost_s"] + costs["new_steps_s"] == pytest.approx(costs["wall_s"], abs=0.01)
    assert 0 < costs["goodput"] < 1
    # The closing line says what run.json says, and `mgpu status` says it the same way.
    assert f"; {told(costs)}; logs and run.json in" in result.console
