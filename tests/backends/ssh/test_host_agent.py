"""--host-agent: one SSH session per host runs the host's checks, then every task of it, in every
attempt (backends/ssh/agent.py, host_agent.py), against real sshd servers."""

from __future__ import annotations

import json

import pytest

import lab_mgpu
from ssh_helpers import PYTHON, unique_run_id
from test_launch_over_ssh import forced_host, pick_free_ports

pytestmark = pytest.mark.ssh

# Worker 1 fails in the first attempt: the restart starts all four again through the agent.
FAILS_ONCE = ("import os, sys\n"
              "index, attempt = os.environ['MGPU_TASK_INDEX'], os.environ['MGPU_ATTEMPT']\n"
              "print('task', index, 'attempt', attempt, flush=True)\n"
              "sys.exit(3 if (index, attempt) == ('1', '0') else 0)\n")


def test_one_session_per_host_for_its_checks_and_every_task_and_none_at_a_restart(ssh_lab, tmp_path):
    sessions = tmp_path / "sessions"
    force = f'echo session "$(printf %s "$SSH_ORIGINAL_COMMAND" | head -c 300 | tr "\\n" " ")" >> {sessions}; eval "$SSH_ORIGINAL_COMMAND"'
    with forced_host(ssh_lab, tmp_path, "counted", force) as (known, config):
        ports = pick_free_ports(4)
        sessions.write_text("")
        proc = lab_mgpu.start(tmp_path, "launch", "--workers", ",".join(f"counted:{p}" for p in ports),
                              "--host-agent", "--max-restarts", "1", "--ssh-config", str(config),
                              "--known-hosts", str(known), "--connect-timeout", "5",
                              "--run-id", unique_run_id("agent"), "--", PYTHON, "-c", FAILS_ONCE)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        for index in range(4):
            for attempt in range(2):
                assert f"task {index} attempt {attempt}" in out.decode(), out.decode() + err.decode()
        assert sessions.read_text().count("session") == 1, (sessions.read_text(), err.decode())
