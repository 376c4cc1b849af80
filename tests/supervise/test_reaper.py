"""The per-run reaper: kills the run's processes when its launcher dies, and only then."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from launcher.host import proctree
from launcher.supervise.options import SuperviseOptions
from launcher.supervise.reaper import Reaper
from launcher.supervise.rundir import make_run_dir
from launching import wait_for

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import signal, sys, time\nif sys.argv[1:] == ['stubborn']: signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)\n"


LAUNCH_ID = "0123456789abcdef"


def start_tagged(run_id, *args, launch_id=LAUNCH_ID):
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *args],
                            env={**os.environ, "MGPU_RUN_ID": run_id, "MGPU_LAUNCH_ID": launch_id},
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_launcher_death_stops_tagged_processes_only(run_id, tmp_path):
    """The launch's processes only: not another run's, nor those of a later launch that reuses the run id.
    A stopped one (SIGSTOP) takes the SIGTERM too, not the SIGKILL after the grace period."""
    bystander_id = run_id + "-other"
    tagged = [start_tagged(run_id), start_tagged(run_id, "stubborn"), start_tagged(run_id)]
    os.kill(tagged[2].pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(tagged[2].pid).status() == psutil.STATUS_STOPPED, 10, what="the stop")
    bystanders = [start_tagged(bystander_id), start_tagged(run_id, launch_id="f" * 16)]
    try:
        launcher_code = (f"import pathlib, sys, time; from launcher.supervise.reaper import Reaper\n"
                         f"from launcher.supervise.rundir import make_run_dir\n"
                         f"from launcher.supervise.options import SuperviseOptions\n"
                         f"run_dir = make_run_dir(SuperviseOptions({run_id + '-dir'!r}, pathlib.Path({str(tmp_path)!r})))\n"
                         f"r = Reaper.start({run_id!r}, 0.5, run_dir, {LAUNCH_ID!r})\n"
                         f"print(r.pid, flush=True); time.sleep(600)\n")
        launcher = subprocess.Popen([sys.executable, "-c", launcher_code], stdout=subprocess.PIPE)
        reaper_pid = int(launcher.stdout.readline())
        launcher.kill()
        launcher.wait()
        wait_for(lambda: all(p.poll() is not None for p in tagged), 15, what="the tagged processes to exit")
        assert [p.returncode for p in tagged] == [-signal.SIGTERM, -signal.SIGKILL, -signal.SIGTERM]
        assert [p.poll() for p in bystanders] == [None, None]
        wait_for(lambda: not os.path.exists(f"/proc/{reaper_pid}") or
                 open(f"/proc/{reaper_pid}/stat").read().split()[2] == "Z", 10, what="the reaper to exit")
        assert f"stopped 3 processes of run {run_id}" in (tmp_path / f"{run_id}-dir" / "reaper.log").read_text()
    finally:
        for proc in (*tagged, *bystanders):
            proc.kill()
            proc.wait()


def test_dismissed_reaper_leaves_processes_alone(run_id, tmp_path):
    proc = start_tagged(run_id)
    try:
        reaper = Reaper.start(run_id, 0.5, make_run_dir(SuperviseOptions(f"{run_id}-dir", tmp_path)))
        reaper.dismiss()
        assert proc.poll() is None
        assert proctree.tagged_processes(run_id)
    finally:
        proc.kill()
        proc.wait()
