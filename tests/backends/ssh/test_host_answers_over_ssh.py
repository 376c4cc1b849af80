"""A remote host's answer to its check, over a real sshd: its size is bounded as it is read (a
flood ends the check with one line, not with the launcher holding all of it), whether the session
is to be kept for the host's first task or not, and a crafted answer is one line naming the host."""

import dataclasses
import json
import sys

import pytest

from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launcher.plan.planner import TaskPlan
from launcher.preflight.check import check_hosts_and_reach, raise_for_failures
from launcher.errors import UnreadableAnswer

from launching import free_port
from ssh_helpers import unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(120)]


@pytest.fixture
def runner(ssh_lab):
    backend = SshBackend(ssh_lab.options(), grace_period=2)
    yield backend
    backend.close()


def task_with_python(tmp_path, script: str) -> TaskPlan:
    """A task on sshd-a whose Python is a stand-in that runs `script` (the test hosts share this
    machine's files)."""
    python = tmp_path / "python3"
    python.write_text(script)
    python.chmod(0o755)
    run_id = unique_run_id("answers")
    env = {"TF_CONFIG": "{}", "MGPU_RUN_ID": run_id, "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": "0"}
    return TaskPlan("worker", 0, "sshd-a", free_port(), False, SshSettings(), (str(python), "train.py"), env,
                    str(tmp_path), False)


@pytest.mark.parametrize("handover", [False, True], ids=["session-ends", "session-kept"])
def test_a_flood_from_a_remote_host_is_cut_off_at_the_limit(runner, tmp_path, handover):
    task = task_with_python(tmp_path, "#!/bin/sh\nexec cat /dev/zero\n")
    reports, _, _ = check_hosts_and_reach([task], [task], runner, handover=handover)
    assert reports[0].problems == ["host sshd-a answered the check with something mgpu cannot read: "
                                   "more than 4 MiB on stdout"], reports[0].problems
    with pytest.raises(UnreadableAnswer):
        raise_for_failures(reports)


def test_a_crafted_answer_from_a_remote_host_is_one_line(runner, tmp_path):
    answer = json.dumps({"python": "3.11.7", "busy_ports": [], "missing_modules": [], "gpus": 0,
                         "reach": {"listen_errors": [], "reach": {}, "dialed": {}, "addresses": []}})
    task = task_with_python(tmp_path, f"#!{sys.executable}\nprint({answer!r})\n")
    reports, _, _ = check_hosts_and_reach([task], [task], runner, handover=True)
    assert reports[0].problems == ["host sshd-a answered the check with something mgpu cannot read: "
                                   "reach.listen_errors is a list, not an object of texts"], reports[0].problems
