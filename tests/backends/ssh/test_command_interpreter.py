"""The command's own interpreter is the one checked, over real sshd hosts: `-- python3 train.py`
runs the `python3` that the task's shell finds with the task's PATH, which may be a venv without
the program's modules though another Python has them. The check finds it the same way on every
host, looks up the script's imports with it, and names it."""

import io
import os
import subprocess
import sys

import pytest

from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launcher.plan.planner import TaskPlan
from launcher.preflight.check import check_hosts_and_reach, close_handovers, run_checks
from launcher.preflight.probes import host_check_command, needs_of
from launcher.errors import CheckFailed

from launching import free_port
from ssh_helpers import unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(120)]


@pytest.fixture
def runner(ssh_lab):
    backend = SshBackend(ssh_lab.options(), grace_period=2)
    yield backend
    backend.close()


def task(host: str, index: int, folder, path: str) -> TaskPlan:
    env = {"TF_CONFIG": "{}", "MGPU_RUN_ID": unique_run_id("interpreter"), "MGPU_TASK_TYPE": "worker",
           "MGPU_TASK_INDEX": str(index), "PATH": f"{path}:/usr/bin:/bin"}
    return TaskPlan("worker", index, host, free_port(), False, SshSettings(), ("python3", "train.py"), env,
                    str(folder), False)


def test_each_host_checks_the_python3_its_tasks_find_with_the_scripts_imports(runner, tmp_path):
    # On sshd-a the tasks' PATH finds this Python, which has psutil; on sshd-b a venv that has not.
    with_it = tmp_path / "with-psutil"
    with_it.mkdir()
    (with_it / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (with_it / "python3").chmod(0o755)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (tmp_path / "train.py").write_text("import psutil\nprint(psutil.cpu_count())\n")
    a, b = task("sshd-a", 0, tmp_path, str(with_it)), task("sshd-b", 1, tmp_path, str(venv / "bin"))
    # The variables reach the check's shell on its stdin, as the task's do: no value on a command line.
    command = host_check_command(needs_of(b), [b.port], b.workdir)
    assert "with-psutil" not in command and str(venv) not in command
    reports, _, _ = check_hosts_and_reach([a, b], [a, b], runner, handover=True)  # as a launch checks
    close_handovers(reports)
    assert [report.interpreter for report in reports] == [os.path.abspath(sys.executable), str(venv / "bin" / "python3")]
    assert reports[0].ok, reports[0].problems
    assert reports[0].own_name is None  # only a JAX program's host is asked what its name resolves to
    assert reports[1].problems == [
        f"no module psutil for {venv}/bin/python3, the python3 that runs the tasks (train.py imports it): "
        "install it there, or name the interpreter that has it in the command"]
    console = io.StringIO()
    with pytest.raises(CheckFailed, match="check failed on sshd-b: no module psutil"):
        run_checks([a, b], runner, console)
    # Both hosts with this Python: the check passes and names the interpreter the tasks run.
    b = task("sshd-b", 1, tmp_path, str(with_it))
    console = io.StringIO()
    run_checks([a, b], runner, console)
    version = "%d.%d.%d" % sys.version_info[:3]
    assert (f"mgpu: the tasks run python3, {os.path.abspath(sys.executable)} (Python {version}) on sshd-a, sshd-b\n"
            in console.getvalue())
