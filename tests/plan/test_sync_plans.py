"""What --sync and --setup put in the plan: where each task runs, the digest every task gets, and
what the setup runs with."""

from __future__ import annotations

from launcher.config.spec import ClusterSpec, TaskSpec
from launcher.config.spec_file import load_spec_text
from launcher.config.sync import SyncedFile, SyncedFolder
from launcher.plan.planner import plan_tasks
from launcher.plan.render import plan_to_dict

FOLDER = SyncedFolder("/home/me/proj", (SyncedFile("train.py", 0o644, 9, "ab" * 32),))
TASKS = (TaskSpec("worker", "gpu0", 2222), TaskSpec("worker", "h2", 2222))


def planned(**spec):
    return plan_tasks(ClusterSpec(tasks=TASKS, **spec), run_id="r", local_hosts=frozenset({"gpu0"}),
                      launcher_python="python3", synced=FOLDER)


def test_local_tasks_run_in_the_folder_and_remote_ones_in_its_copy():
    here, there = planned(sync="proj")
    assert here.workdir == "/home/me/proj" and there.workdir == "mgpu-sync/proj"
    assert {here.env["MGPU_SYNC_DIGEST"], there.env["MGPU_SYNC_DIGEST"]} == {FOLDER.digest}
    here, there = planned(sync="proj", workdir="/scratch/proj")
    assert here.workdir == "/home/me/proj" and there.workdir == "/scratch/proj"
    assert plan_to_dict(there)["sync"] == {"source": "/home/me/proj", "files": 1, "bytes": 9, "digest": FOLDER.digest,
                                          "copied_to": "/scratch/proj"}


def test_the_setup_gets_the_runs_variables_not_the_jobs():
    plans = planned(sync="proj", setup="pip install -r requirements.txt", env={"TOKEN": "t"}, setup_timeout=60.0)
    setup = plans[1].setup
    assert setup is plans[0].setup and setup.command == "pip install -r requirements.txt" and setup.timeout == 60.0
    assert setup.env == {"MGPU_RUN_ID": "r", "MGPU_SYNC_DIGEST": FOLDER.digest, "TOKEN": "t"}


def test_a_spec_file_says_sync_and_setup():
    spec = load_spec_text("cluster: {worker: [h1:2222]}\nsync: ./proj\nsetup: make\nsetup_timeout: 30\n", "s.yaml")
    assert (spec.sync, spec.setup, spec.setup_timeout) == ("./proj", "make", 30.0)
