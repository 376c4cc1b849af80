"""Shell command lines for remote tasks. Pure string building, no I/O.

sshd hands the command to the user's login shell. We make that shell exec a
POSIX sh running a small wrapper, which:

- prints its pid on stderr (PGID_MARKER). sshd starts every session with
  setsid(), and the wrapper only ever execs, so that pid is the session and
  process group id of the whole task tree, and `kill -TERM -PGID` reaches it all;
- starts a detached watcher that reads the channel's stdin until EOF. sshd
  closes that pipe when the session ends for any reason: the task finished,
  the launcher closed the channel, or the connection dropped (launcher killed,
  network gone). The watcher then sends SIGTERM to the group, waits up to the
  grace period for the task to go, and sends SIGKILL. So no remote process
  outlives its SSH session;
- with a port to watch, starts a second detached loop that prints LISTENING_MARKER
  on stderr once a process of the session listens on that port (read from
  /proc/net/tcp and the processes' socket inodes), then exits; it also exits
  when the task does. This is how the launcher knows that a program without the
  ready line has started its server;
- changes to the workdir and execs `env K=V ... argv` with stdin from
  /dev/null, so sshd sees the task's own exit status or signal.

Every argv element and env value goes through shlex.quote, so quotes, $(),
backticks, newlines and unicode arrive byte-exact.
"""

from __future__ import annotations

import shlex
import signal
from typing import Iterable, Mapping, Sequence

from launcher.config.addresses import parse_env_name

PGID_MARKER = "MGPU_REMOTE_PGID"
LISTENING_MARKER = "MGPU_REMOTE_LISTENING"

# $1 = process group, $2 = grace seconds. The watcher is in the group too, so
# it ignores the TERM it sends; the final KILL ends it along with the rest.
_WATCHER = (
    "trap '' INT TERM HUP; "
    "cat >/dev/null; "
    'kill -TERM "-$1" 2>/dev/null; '
    "n=0; "
    'while [ "$n" -lt "$2" ] && kill -0 "$1" 2>/dev/null; do sleep 1; n=$((n+1)); done; '
    'kill -KILL "-$1" 2>/dev/null'
)


# $1 = session id (the task's process group), $2 = port. Field 4 after the command name
# in /proc/PID/stat is the session; a listening socket has state 0A in /proc/net/tcp*.
_LISTEN_WATCHER = (
    "trap '' INT TERM HUP; "
    'sid=$1; hex=$(printf \':%04X\' "$2"); '
    'while kill -0 "$sid" 2>/dev/null; do '
    "inodes=$(awk -v p=\"$hex\" '$4 == \"0A\" && substr($2, length($2) - 4) == p {print $10}' "
    "/proc/net/tcp /proc/net/tcp6 2>/dev/null); "
    'if [ -n "$inodes" ]; then for dir in /proc/[0-9]*; do '
    '{ read -r stat < "$dir/stat"; } 2>/dev/null || continue; '
    'set -- ${stat##*) }; [ "$4" = "$sid" ] || continue; '
    'links=$(ls -l "$dir/fd" 2>/dev/null); '
    'for inode in $inodes; do case "$links" in *"socket:[$inode]"*) '
    f'echo {LISTENING_MARKER}; exit 0;; esac; done; '
    "done; fi; "
    "sleep 0.25; "
    "done"
)


def sh(script: str) -> str:
    """A command line for any POSIX-like login shell that runs `script` in /bin/sh."""
    return "exec /bin/sh -c " + shlex.quote(script)


def env_assignments(env: Mapping[str, str]) -> list[str]:
    """`NAME=value` words for env(1), quoted for sh. Raises ValueError for a bad name."""
    return [shlex.quote(f"{parse_env_name(name)}={value}") for name, value in env.items()]


def task_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    workdir: str | None,
    kill_grace: int,
    listen_port: int | None = None,
) -> str:
    """The command line that starts one task over SSH (see the module docstring)."""
    if not argv:
        raise ValueError("empty argv")
    lines = [
        "exec 3<&0 </dev/null",
        f'echo "{PGID_MARKER} $$" >&2',
        "( ( exec /bin/sh -c "
        + shlex.quote(_WATCHER)
        + f' mgpu-watch "$$" {int(kill_grace)} <&3 >/dev/null 2>&1 3<&- ) & )',
        "exec 3<&-",
    ]
    if listen_port is not None:
        lines.append(
            "( ( exec /bin/sh -c " + shlex.quote(_LISTEN_WATCHER) + f' mgpu-listen "$$" {int(listen_port)} >&2 ) & )'
        )
    run = "exec env " + " ".join(env_assignments(env) + [shlex.quote(a) for a in argv])
    if workdir:
        run = f"cd {shlex.quote(workdir)} && {run}"
    lines.append(run)
    return sh("\n".join(lines))


def parse_pgid_line(line: bytes) -> int | None:
    """The process group from the wrapper's first stderr line, or None if it is another line."""
    text = line.decode("utf-8", "replace").strip()
    prefix = PGID_MARKER + " "
    if text.startswith(prefix) and text[len(prefix):].isdigit():
        return int(text[len(prefix):])
    return None


def signal_command(pgids: Iterable[int], signum: int) -> str:
    """Signal remote tasks' whole process groups; quiet for groups already gone."""
    name = signal.Signals(signum).name.removeprefix("SIG")
    groups = " ".join(f"-{int(pgid)}" for pgid in pgids)
    return sh(f"kill -{name} {groups} 2>/dev/null; exit 0")
