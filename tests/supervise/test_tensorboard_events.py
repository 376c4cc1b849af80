"""`--tensorboard DIR`: a real run's event files, read back with TensorBoard's own reader; tensorboardX
imported only by a launch with the option."""

import json
import os
import subprocess
import sys

import pytest

from launching import MGPU
from needs import installed_version, stand_in
from supervisor_helpers import make_plans, supervise_plans

pytestmark = pytest.mark.timeout(90)

# Two tasks that report their steps and their time split; worker:1 fails at step 3 of the first
# attempt, the second attempt goes on to step 20 (long enough for busy shares: pace.py samples every 2 s).
PROGRAM = """
import os, sys, time
attempt = int(os.environ['MGPU_ATTEMPT'])
me = int(sys.argv[1])
for step in range(1, 21):
    time.sleep(0.25)
    print(f'MGPU_PROGRESS {step}/20', flush=True)
    print('MGPU_TIME_SPLIT 200 50', flush=True)
    if attempt == 0 and step == 3 and me == 1:
        print('ValueError: bad batch', file=sys.stderr, flush=True)
        sys.exit(3)
"""


# TensorBoard's own reader, in a process of its own where TensorFlow cannot be imported: TensorBoard
# then reads with its own stub, as on a machine without TensorFlow (importing it costs seconds).
READER = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
reader = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
reader.Reload()
tags = reader.Tags()
print(json.dumps({
    "scalars": {tag: [e.value for e in reader.Scalars(tag)] for tag in tags["scalars"]},
    "texts": {tag: [e.tensor_proto.string_val[0].decode() for e in reader.Tensors(tag)] for tag in tags["tensors"]},
}))
"""


def test_the_event_files_carry_goodput_lost_time_restarts_hosts_busy_shares_and_steps(run_id, tmp_path):
    installed_version("tensorboardX")
    installed_version("tensorboard")
    plans = make_plans(run_id, [], workers=2)
    plans = [type(p)(**{**p.__dict__, "argv": (sys.executable, "-c", PROGRAM, str(p.index))}) for p in plans]
    result = supervise_plans(plans, run_id, tmp_path, max_restarts=1, slow_window=1.0,
                             tensorboard=tmp_path / "tb")
    assert result.error is None, result.error
    [events] = (tmp_path / "tb" / "mgpu").glob("events.out.tfevents.*")
    read = subprocess.run([sys.executable, "-c", READER, str(events.parent)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": stand_in(
                              tmp_path, "tensorflow", tmp_path / "tensorflow-loaded", importable=False)})
    assert read.returncode == 0, read.stderr
    found = json.loads(read.stdout)
    scalars = found["scalars"]
    categories = ("start_up", "redone", "after_last_step", "stalled", "restart", "finish")
    assert {"mgpu/goodput", "mgpu/time_lost_s", "mgpu/restarts", "mgpu/hosts_in_use", "mgpu/steps_per_s",
            "mgpu/busy/worker_0", "mgpu/busy/worker_1", *(f"mgpu/lost_s/{c}" for c in categories)} <= set(scalars), \
        sorted(scalars)
    costs = result.run["costs"]
    assert scalars["mgpu/goodput"][-1] == pytest.approx(costs["goodput"], abs=1e-4)
    assert scalars["mgpu/lost_s/redone"][-1] == pytest.approx(costs["lost_s"]["redone"], abs=1e-3)
    assert scalars["mgpu/restarts"][-1] == 1
    assert scalars["mgpu/hosts_in_use"][-1] == 1
    assert max(scalars["mgpu/steps_per_s"]) > 0
    [told] = found["texts"]["mgpu/restarts/text_summary"]
    assert told.startswith("restart 1: program-error (worker:1 on 127.0.0.1): "), told
    # The run's samples are in its folder too.
    assert (result.run_dir / "samples.jsonl").read_text().count("\n") >= 2


def test_a_launch_imports_tensorboardx_only_with_tensorboard(tmp_path):
    """tensorboardX (which brings numpy, and torch where it is installed) is for --tensorboard alone.
    The stand-in leaves a file when imported, and has no writer: that run says it cannot write."""
    loaded = tmp_path / "tensorboardX-loaded"
    env = dict(os.environ, PYTHONPATH=stand_in(tmp_path, "tensorboardX", loaded))
    launch = [*MGPU, "launch", "--local", "1", "--log-dir", str(tmp_path / "runs"), "--",
              sys.executable, "-c", "print('MGPU_PROGRESS 1/1')"]
    done = subprocess.run(launch, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not loaded.exists()
    done = subprocess.run([*MGPU, "launch", "--tensorboard", str(tmp_path / "tb"), *launch[len(MGPU) + 1:]],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert loaded.exists()
    assert "cannot write TensorBoard event files in " in done.stdout + done.stderr
