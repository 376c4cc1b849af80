"""The soak, short (benchmarks/soak.py is the long one): one run of three plain-Python workers on
this machine in lockstep, through three faults one after another, each charged to its cause and
task, and the run ending with every step done and nothing left behind.

kill -9 of a worker (`killed`), SIGSTOP of another (`stalled`, named as the one the others waited
for), SIGTERM of a third from outside (`preempted`); each injected once the attempt after the last
one has made steps of its own."""

from __future__ import annotations

import json
import os
import signal

import pytest

from launching import finish, start_mgpu, wait_for
from supervisor_helpers import assert_run_gone

pytestmark = pytest.mark.timeout(180)

TOTAL = 60
# Each worker listens on its TF_CONFIG port (how mgpu sees it joined), then steps in lockstep with
# the others through files in a shared folder, as a collective would (a worker whose peer is gone
# or stopped waits); worker 0 checkpoints every step, and a restart resumes from the checkpoint. The
# attempt after the last fault steps without a pause to the end.
PROGRAM = r"""
import json, os, pathlib, socket, sys, time
folder, total, faults = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tf = json.loads(os.environ["TF_CONFIG"])
index, attempt, workers = tf["task"]["index"], os.environ["MGPU_ATTEMPT"], len(tf["cluster"]["worker"])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(tf["cluster"]["worker"][index].rsplit(":", 1)[1])))
server.listen()
checkpoint = folder / "step"
start = int(checkpoint.read_text().split()[0]) if checkpoint.exists() else 0
mine = folder / f"a{attempt}-w{index}"
peers = [folder / f"a{attempt}-w{i}" for i in range(workers) if i != index]
for step in range(start + 1, total + 1):
    for _ in range(1200):  # every peer's step before this one, 120 s at most
        if step == start + 1 or all(p.exists() and int(p.read_text() or 0) >= step - 1 for p in peers):
            break
        time.sleep(0.02)
    else:
        sys.exit(3)
    if int(attempt) < faults:
        time.sleep(0.05)  # the attempts with a fault to come leave the test time to inject it
    if index == 0:
        (folder / "step.tmp").write_text(f"{step} {attempt}")
        (folder / "step.tmp").replace(checkpoint)
    (folder / f"w{index}.tmp").write_text(str(step))
    (folder / f"w{index}.tmp").replace(mine)
    print(f"MGPU_PROGRESS {step}/{total}", flush=True)
"""
FAULTS = ((signal.SIGKILL, "worker:1", "killed"), (signal.SIGSTOP, "worker:2", "stalled"),
          (signal.SIGTERM, "worker:1", "preempted"))


def test_three_faults_in_one_run_are_each_charged_to_their_cause_and_task(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    run_id = f"soak-short-{os.getpid()}"
    run_json = tmp_path / "runs" / run_id / "run.json"
    # The stall timeout is the SIGSTOP's detection; steps come every 0.05-0.2 s, far inside it.
    proc = start_mgpu("launch", "--local", "3", "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                      "--max-restarts", "2", "--stall-timeout", "4",
                      "--grace-period", "1", "--", "python3", "-c", PROGRAM, str(folder), str(TOTAL), str(len(FAULTS)),
                      cwd=tmp_path)

    def checkpoint() -> tuple[int, int]:
        try:
            step, attempt = (folder / "step").read_text().split()
            return int(step), int(attempt)
        except (OSError, ValueError):
            return 0, -1

    try:
        for attempt, (signum, task, _) in enumerate(FAULTS):
            # Steps of this attempt's own, past where it resumed, before its fault.
            resumed = checkpoint()[0]
            wait_for(lambda: checkpoint()[1] == attempt and checkpoint()[0] >= resumed + 5 or proc.poll() is not None,
                     60, f"attempt {attempt}'s steps")
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            pid = json.loads(run_json.read_text())["attempts"][attempt]["tasks"][task]["pid"]
            os.kill(pid, signum)
        code, out = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, out[-4000:]
    record = json.loads(run_json.read_text())
    charged = [(a.get("cause"), a.get("task")) for a in record["attempts"][:-1]]
    assert charged == [(cause, task) for _, task, cause in FAULTS], (charged, out[-3000:])
    assert "worker:2 on 127.0.0.1 is stopped (SIGSTOP, or a debugger)" in out
    assert checkpoint()[0] == TOTAL and record["status"] == "succeeded"
    assert record["costs"]["restarts"] == 3 and 0 < record["costs"]["goodput"] < 1
    assert_run_gone(run_id)
