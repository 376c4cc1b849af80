"""Shell command lines for remote tasks. Pure string building, no I/O.

sshd hands the command to the user's login shell. We make that shell exec a
POSIX sh running a small wrapper, which:

- prints its pid on stderr (PGID_MARKER). sshd starts every session with
  setsid(), and the wrapper only ever execs, so that pid is the session and
  process group id of the whole task tree, and `kill -TERM -PGID` reaches it all;
- reads the task's environment from the channel's stdin (RemoteTask.stdin, one
  shell-quoted value per line, up to ENV_END). Values never appear on a command
  line, where every user of the host could read them with ps; only the names do;
- starts a detached watcher that reads the rest of the channel's stdin until
  EOF. sshd closes that pipe when the session ends for any reason: the task
  finished, the launcher closed the channel, or the connection dropped
  (launcher killed, network gone). The watcher then sends SIGTERM to the group
  and to every process of the same user whose environment carries the task's
  tags (MGPU_RUN_ID, MGPU_ATTEMPT, MGPU_TASK_TYPE, MGPU_TASK_INDEX: this catches
  processes that left the group with setsid or setpgid), waits up to the grace
  period for them to go, and sends SIGKILL. So no remote process outlives its
  SSH session;
- with a port to watch, starts a second detached loop that prints LISTENING_MARKER
  on stderr once a process of the session listens on that port (read from
  /proc/net/tcp and the processes' socket inodes), then exits; it also exits
  when the task does. This is how the launcher knows that a program without the
  ready line has started its server;
- exports the environment, changes to the workdir and execs argv with stdin
  from /dev/null, so sshd sees the task's own exit status or signal.

Every argv element and env value goes through shlex.quote, so quotes, $(),
backticks, newlines and unicode arrive byte-exact.
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
from typing import Iterable, Mapping, Sequence

from launcher.config.addresses import parse_env_name
from launcher.protocol import ENV_ATTEMPT, ENV_RUN_ID, ENV_TASK_INDEX, ENV_TASK_TYPE

PGID_MARKER = "MGPU_REMOTE_PGID"
LISTENING_MARKER = "MGPU_REMOTE_LISTENING"
# The login shell gets the command as one argument, and Linux caps one argument at 128 KiB.
MAX_COMMAND_BYTES = 128 * 1024 - 1
ENV_END = "MGPU_ENV_END"
TAG_NAMES = (ENV_RUN_ID, ENV_ATTEMPT, ENV_TASK_TYPE, ENV_TASK_INDEX)

# $1 = process group, $2 = grace seconds, then no tags or all four NAME=value tags (TAG_NAMES).
# The watcher is in the group too, so it ignores the TERM it sends, and its final KILL goes to the
# tagged processes first: kill signals its operands in order, and signalling the group ends the
# watcher itself. Its own environment has no tags: it starts before the task's env is exported.
_WATCHER = r"""trap '' INT TERM HUP
cat >/dev/null
g=$1; t=$2; shift 2
tagged() {
  [ "$#" = 4 ] || return 0
  for f in $(grep -l -F -e "$1" /proc/[0-9]*/environ 2>/dev/null); do
    d=${f%/environ}
    [ -O "$d" ] || continue
    n=$(tr '\0' '\n' <"$f" 2>/dev/null | grep -c -F -x -e "$1" -e "$2" -e "$3" -e "$4")
    [ "$n" = 4 ] && echo "${d#/proc/}"
  done
}
kill -TERM "-$g" $(tagged "$@") 2>/dev/null
n=0
while [ "$n" -lt "$t" ] && { kill -0 "$g" 2>/dev/null || [ -n "$(tagged "$@")" ]; }; do sleep 1; n=$((n+1)); done
kill -KILL $(tagged "$@") "-$g" 2>/dev/null
"""


@dataclasses.dataclass(frozen=True)
class RemoteTask:
    command: str  # for exec_command: no env value in it
    stdin: bytes  # to send on the session's stdin at once: the env values


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


def _one_line(value: str) -> str:
    """`value` quoted for sh on a single line (newlines become "$mgpu_nl" outside the quotes)."""
    return shlex.quote(value).replace("\n", "'\"$mgpu_nl\"'")


def env_block(env: Mapping[str, str]) -> bytes:
    """What the wrapper reads from stdin: `mgpu_vI='value'` lines, then ENV_END."""
    lines = [f"mgpu_v{i}={_one_line(value)}" for i, value in enumerate(env.values())]
    return ("\n".join(lines + [ENV_END]) + "\n").encode("utf-8", "surrogateescape")


def safe_workdir(workdir: str) -> str:
    """A workdir that cd cannot take for an option (`-P`, `-`)."""
    return "./" + workdir if workdir.startswith("-") else workdir


def task_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    workdir: str | None,
    kill_grace: int,
    listen_port: int | None = None,
) -> RemoteTask:
    """The command line that starts one task over SSH, and what to send on its stdin (see the
    module docstring). Raises ValueError for a bad env name."""
    if not argv:
        raise ValueError("empty argv")
    names = [parse_env_name(name) for name in env]
    tags = [shlex.quote(f"{name}={env[name]}") for name in TAG_NAMES if name in env]
    tags = tags if len(tags) == len(TAG_NAMES) else []
    lines = [
        "exec 3<&0 </dev/null",
        f'echo "{PGID_MARKER} $$" >&2',
        "mgpu_nl='\n'",
        "mgpu_end=",
        f'while IFS= read -r mgpu_line <&3; do [ "$mgpu_line" = {ENV_END} ] && {{ mgpu_end=1; break; }}; '
        'eval "$mgpu_line"; done',
        '[ -n "$mgpu_end" ] || exit 255',  # the launcher went away before sending the environment
        "( ( exec /bin/sh -c "
        + shlex.quote(_WATCHER)
        + f' mgpu-watch "$$" {int(kill_grace)} {" ".join(tags)} <&3 >/dev/null 2>&1 3<&- ) & )',
        "exec 3<&-",
    ]
    if listen_port is not None:
        lines.append(
            "( ( exec /bin/sh -c " + shlex.quote(_LISTEN_WATCHER) + f' mgpu-listen "$$" {int(listen_port)} >&2 ) & )'
        )
    if names:
        lines.append("export " + " ".join(f'{name}="$mgpu_v{i}"' for i, name in enumerate(names)))
    run = "exec " + " ".join(shlex.quote(a) for a in argv)
    if workdir:
        run = f"cd {shlex.quote(safe_workdir(workdir))} && {run}"
    lines.append(run)
    return RemoteTask(sh("\n".join(lines)), env_block(env))


def parse_pgid_line(line: bytes) -> int | None:
    """The process group from the wrapper's first stderr line, or None if it is another line."""
    text = line.decode("utf-8", "replace").strip()
    prefix = PGID_MARKER + " "
    if text.startswith(prefix) and text[len(prefix):].isascii() and text[len(prefix):].isdigit():
        return int(text[len(prefix):])
    return None


def signal_command(pgids: Iterable[int], signum: int) -> str:
    """Signal remote tasks' whole process groups; quiet for groups already gone."""
    name = signal.Signals(signum).name.removeprefix("SIG")
    groups = " ".join(f"-{int(pgid)}" for pgid in pgids)
    return sh(f"kill -{name} {groups} 2>/dev/null; exit 0")
