"""The remote wrapper's command run as sshd runs it, for the tests of the wrapper and of what it reports."""

from __future__ import annotations

import subprocess

from launcher.backends.ssh import remote_command


def start_like_sshd(remote: remote_command.RemoteTask) -> subprocess.Popen:
    """Run a command line as sshd does for a session without a pty (own session, pipes), and send
    the env on its stdin as the SSH runner does."""
    proc = subprocess.Popen(["/bin/sh", "-c", remote.command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    proc.stdin.write(remote.stdin)
    proc.stdin.flush()
    return proc


def read_pgid(proc: subprocess.Popen) -> int:
    line = proc.stderr.readline()
    _, pgid = remote_command.split_pgid_line(line)
    assert pgid is not None, line
    return pgid


# A task that prints its pid, then sleeps.
SLEEPER = "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n"
