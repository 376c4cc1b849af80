"""A host whose login takes longer than --connect-timeout still starts its task: the connection is
bounded by --connect-timeout, the login shell's start-up files (conda, `module`, pyenv) by at least
60 s of their own (docs/ssh.md, Timeouts)."""

from __future__ import annotations

import pytest

import lab_mgpu
from launcher.host.ports import pick_free_ports
from ssh_helpers import PYTHON, unique_run_id
from ssh_tasks import forced_host

pytestmark = pytest.mark.ssh

LOGIN_SECONDS = 4  # a start-up file this slow, against a --connect-timeout of 1 s


def test_a_login_slower_than_the_connect_timeout_still_starts_the_task(ssh_lab, tmp_path):
    slow_login = f'sleep {LOGIN_SECONDS}; eval "$SSH_ORIGINAL_COMMAND"'
    with forced_host(ssh_lab, tmp_path, "slowlogin", slow_login) as (known, config):
        port, = pick_free_ports(1)
        proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"slowlogin:{port}", "--no-check", "--ssh-config",
                              str(config), "--known-hosts", str(known), "--connect-timeout", "1", "--run-id",
                              unique_run_id("slowlogin"), "--", PYTHON, "-c", "print('task ran', flush=True)")
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "[worker:0] task ran" in out.decode(), out.decode() + err.decode()
