"""The handover: a launch's check session that goes on to start its host's first task.

Before a launch, each remote host runs the probe in an SSH session of its own (preflight/check.py).
Started for a handover, that session's shell does not end with the probe: it says HANDOVER on
stdout and on stderr, then reads lines from stdin until one HANDOVER_TASK=<the quoted command that
starts the host's first task>, and runs that command as a session of its own would, in the same
process. The task then needs no second SSH session, nor the login shell each one starts, whose
start-up files (conda or pyenv init) may cost more than the check. Until HANDOVER, the launcher says
nothing on stdin but the reachability test's words (host/probe/reach_test.py: ALL_DIALED).

Both ends are here: the shell's lines (`handover_script`), the line that starts the task
(`task_line`), and the session kept between them (`Handover`): the check returns one per host
that passed, and the SSH backend is given them (SshBackend.take_handovers) to start those tasks.

Imports nothing of paramiko at run time: preflight builds the shell's lines without it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from launcher.shell import one_line

if TYPE_CHECKING:
    import paramiko

    from launcher.backends.ssh.connection import Connection
    from launcher.backends.ssh.remote_command import RemoteTask
    from launcher.backends.ssh.target import SshTarget

HANDOVER = "mgpu-handover"  # the line the check's shell says once the probe has ended
HANDOVER_TASK = "mgpu_handover_task"  # the shell variable that takes the task's command line


def handover_script(probe: str) -> list[str]:
    """The shell lines that run `probe` (a command line) and then hand its session over.

    The shell, which the session's login shell exec'd as it execs a task's, says HANDOVER once the
    probe has ended (whatever the probe wrote comes before it; on stderr after a newline, should a
    start-up file have left its line unfinished), then runs the task where the session began, with
    its environment untouched by the probe's interpreter (a pyenv or conda shim changes PATH for the
    interpreter it starts). Its `read` takes a line and no byte after it: the task's environment
    follows the task's line on stdin. An ALL_DIALED that came after the probe's last read comes
    before that line, and is passed over. The lines before these must set mgpu_dir=$PWD first."""
    return [
        f"TF_CPP_MIN_LOG_LEVEL=3 {probe} || exit $?",
        f"echo {HANDOVER}",
        f"printf '\\n%s\\n' {HANDOVER} >&2",
        "mgpu_nl='\n'",
        f"{HANDOVER_TASK}=",
        "while IFS= read -r mgpu_line; do",
        f'  case $mgpu_line in {HANDOVER_TASK}=*) eval "$mgpu_line"; break;; esac',
        "done",
        f'[ -n "${HANDOVER_TASK}" ] || exit 0',
        f'{{ [ "$PWD" = "$mgpu_dir" ] || cd "$mgpu_dir"; }} && eval "${HANDOVER_TASK}"',
    ]


def task_line(remote: RemoteTask) -> bytes:
    """What a handed-over session's shell reads to start `remote`, and then what the task reads:
    its environment."""
    return f"{HANDOVER_TASK}={one_line(remote.command)}\n".encode("utf-8", "surrogateescape") + remote.stdin


@dataclasses.dataclass(eq=False)
class Handover:
    """The session a host's check kept to start `task` (its name) on `target`; it holds one session
    slot of `connection` until it starts the task or is closed."""

    task: str
    target: SshTarget
    connection: Connection
    channel: paramiko.Channel

    def close(self) -> None:
        """End the session unused: its shell ends at the end of its stdin."""
        self.channel.close()
        self.connection.release()
