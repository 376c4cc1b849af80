"""Shell command lines for remote tasks. Pure string building, no I/O.

sshd hands the command to the user's login shell (or, for a host's first task after
the checks, the shell of the check's session reads it from stdin and runs it the same
way: handover.py). We make that shell exec a POSIX sh running a small wrapper,
which:

- prints its pid on stderr (PGID_MARKER). sshd starts every session with
  setsid(), and the wrapper only ever execs, so that pid is the session and
  process group id of the whole task tree, and `kill -TERM -PGID` reaches it all;
- reads the task's environment from the channel's stdin (RemoteTask.stdin, one
  shell-quoted value per line, up to ENV_END). Values never appear on a command
  line, where every user of the host could read them with ps; only the names do;
- starts a detached hang-up guard that reads the rest of the channel's stdin until
  EOF. sshd closes that pipe when the session ends for any reason: the task
  finished, the launcher closed the channel, or the connection dropped
  (launcher killed, network gone). The guard then sends SIGTERM to the group
  and to every process of the same user whose environment carries the task's
  tags (MGPU_LAUNCH_ID, MGPU_RUN_ID, MGPU_ATTEMPT, MGPU_TASK_TYPE, MGPU_TASK_INDEX:
  this catches processes that left the group with setsid or setpgid; the launch's
  id keeps it off a later launch's tasks that reuse the run id), waits up to the grace
  period for them to go, and sends SIGKILL. So no remote process outlives its
  SSH session;
- exports the environment, changes to the workdir and execs argv with stdin
  from /dev/null, so sshd sees the task's own exit status or signal.

Every argv element and env value goes through shlex.quote, so quotes, $(),
backticks, newlines and unicode arrive byte-exact. After the PGID line, which comes
before the task runs, stdout and stderr carry only the task's own bytes (and, in stderr, the
join reporter's framed reports, which the launcher takes out).

Whether the task has joined its cluster, and how it uses the CPU, are reported on the task's own
stderr, in frames the launcher takes out again (stream.py's take_reports) so that the task's bytes
stay exact: each report is one line after a marker with a random part of the task's own
(report_marker), written at once. The wrapper starts the join reporter (join_report_command) before
it execs argv, detached as the guard is (no child of the task, which might wait for its children),
in a session of its own where the host has setsid (else in the task's): a loop that reports, once
each, when a process of the task's session (but itself) listens on the task's own port
(LISTENING: TensorFlow's servers; JAX and PyTorch process 0) and when one holds an
established connection to the coordinator's port (CONNECTED: the other JAX and
PyTorch processes, which never listen). It reads /proc/net/tcp{,6} and the
processes' socket inodes, and polls four times a second, so that it also ends soon after the
task. Every
USAGE_INTERVAL_CS it also reports the CPU use of the session's processes (found with pgrep -s, or
by a slower loop over /proc, then five times less often) (USAGE): the sums over their threads of
/proc's schedstat, nanoseconds on a CPU and on a CPU or waiting for one, with
the host's uptime in centiseconds, the sampler's clock; and, when it changes, whether a process of
the session is stopped (STOPPED: state T or t in /proc/PID/stat, SIGSTOP or a debugger) or no
longer is (RUNNING). It exits once the task has ended. No
second SSH session per task is needed for it, nor the login shell each session starts.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import shlex
import signal
from typing import Iterable, Mapping, Sequence

from launcher.config.addresses import parse_env_name
from launcher.protocol import ENV_ATTEMPT, ENV_LAUNCH_ID, ENV_RUN_ID, ENV_TASK_INDEX, ENV_TASK_TYPE, attempt_env
from launcher.shell import one_line, safe_workdir, sh

PGID_MARKER = "MGPU_REMOTE_PGID"
# The login shell gets the command as one argument, and Linux caps one argument at 128 KiB.
MAX_COMMAND_BYTES = 128 * 1024 - 1
ENV_END = "MGPU_ENV_END"
# The launch's id first: the guard's first search is for it, the rarest of them.
TAG_NAMES = (ENV_LAUNCH_ID, ENV_RUN_ID, ENV_ATTEMPT, ENV_TASK_TYPE, ENV_TASK_INDEX)

# $1 = process group, $2 = grace seconds (whole: it waits in sleeps of 1 s), then no tags or the
# NAME=value tags (TAG_NAMES, the launch's id first where the task has one), all of which a process
# must carry.
# The guard is in the group too, so it ignores the TERM it sends (and the ABRT that asks the task
# for its stacks when a run stalls), and its final KILL goes to the tagged processes first: kill
# signals its operands in order, and signalling the group ends the guard itself. Its own
# environment has no tags: it starts before the task's env is exported.
_HANGUP_GUARD = r"""trap '' INT TERM HUP ABRT
cat >/dev/null
g=$1; t=$2; shift 2
tagged() {
  [ "$#" -gt 0 ] || return 0
  for f in $(grep -l -F -e "$1" /proc/[0-9]*/environ 2>/dev/null); do
    d=${f%/environ}
    [ -O "$d" ] || continue
    n=0
    for tag in "$@"; do
      tr '\0' '\n' <"$f" 2>/dev/null | grep -q -F -x -e "$tag" && n=$((n+1))
    done
    [ "$n" = "$#" ] && echo "${d#/proc/}"
  done
}
kill -TERM "-$g" $(tagged "$@") 2>/dev/null
kill -CONT "-$g" $(tagged "$@") 2>/dev/null
n=0
while [ "$n" -lt "$t" ] && { kill -0 "$g" 2>/dev/null || [ -n "$(tagged "$@")" ]; }; do sleep 1; n=$((n+1)); done
kill -KILL $(tagged "$@") "-$g" 2>/dev/null
"""


@dataclasses.dataclass(frozen=True)
class RemoteTask:
    command: str  # for exec_command (or a handed-over check's shell: handover.task_line): no env value in it
    stdin: bytes  # to send on the session's stdin at once: the env values


# Reports of the join reporter, each a line after the marker.
LISTENING = "listening"
CONNECTED = "connected"
USAGE = "usage"  # "usage <uptime cs> <ns on a CPU> <ns on a CPU or waiting for one>"
STOPPED = "stopped"  # a process of the session is stopped (state T or t), said when it first is
RUNNING = "running"  # none is any more, said when that changes
USAGE_INTERVAL_CS = 200

# $1 = session id (the task's process group), $2 = own port, $3 = coordinator port ("-": none),
# $4 = centiseconds between usage reports, $5 = the marker's random part. It is in the task's
# session and group: it ignores what the launcher sends them (ABRT asks for stacks), counts its own
# CPU use out, and ends once the session's leader (the task) has.
# Field 4 after the command name in /proc/PID/stat is the session; in /proc/net/tcp* field 4 is
# the state (0A listening, 01 established), fields 2 and 3 the local and remote address:port.
# /proc/uptime's first field has two decimals: without its dot, it counts centiseconds.
_JOIN_REPORTER = r"""trap '' INT TERM HUP ABRT
sid=$1; every=$4; nonce=$5; me=$$
say() { printf 'mgpu-%s %s
' "$nonce" "$*"; }
hex() { [ "$1" = - ] || printf ':%04X' "$1"; }
own=$(hex "$2"); coord=$(hex "$3")
listening=; connected=; joined=; stopped=; next=0
# The session's processes: pgrep reads /proc in C; a loop in sh costs some 0.2 ms of CPU a process,
# so without pgrep a host with thousands of processes is sampled five times less often.
if command -v pgrep >/dev/null 2>&1; then
  session() { pgrep -s "$sid" | grep -v -x "$me"; }
else
  every=$((every * 5))
  session() {
    for dir in /proc/[0-9]*; do
      { read -r stat < "$dir/stat"; } 2>/dev/null || continue
      set -- ${stat##*) }
      [ "$4" = "$sid" ] && [ "${dir#/proc/}" != "$me" ] && echo "${dir#/proc/}"
    done
  }
fi
[ -z "$own" ] && [ -z "$coord" ] && joined=1
while kill -0 "$sid" 2>/dev/null; do
  if [ -z "$joined" ]; then
    found=$(awk -v own="$own" -v coord="$coord" '
      own != "" && $4 == "0A" && substr($2, length($2) - 4) == own { print "listening", $10 }
      coord != "" && $4 == "01" && substr($3, length($3) - 4) == coord { print "connected", $10 }
    ' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
    if [ -n "$found" ]; then
      for dir in /proc/[0-9]*; do
        { read -r stat < "$dir/stat"; } 2>/dev/null || continue
        set -- ${stat##*) }
        [ "$4" = "$sid" ] || continue
        links=$(ls -l "$dir/fd" 2>/dev/null)
        set -- $found
        while [ "$#" -ge 2 ]; do
          case "$links" in *"socket:[$2]"*)
            if [ "$1" = listening ] && [ -z "$listening" ]; then listening=1; say listening; fi
            if [ "$1" = connected ] && [ -z "$connected" ]; then connected=1; say connected; fi;;
          esac
          shift 2
        done
      done
    fi
    [ -n "$listening" ] && joined=1
    [ -z "$own" ] && [ -n "$connected" ] && joined=1
  fi
  { read -r up rest < /proc/uptime; } 2>/dev/null || up=0.00
  now=${up%.*}${up#*.}
  if [ "$now" -ge "$next" ]; then
    next=$((now + every))
    pids=$(session)
    used=$(for pid in $pids; do cat "/proc/$pid/task/"*/schedstat 2>/dev/null; done |
      awk '{ c += $1; w += $2 } END { printf "%.0f %.0f", c, c + w }')
    say usage "$now" $used
    held=
    for pid in $pids; do
      { read -r stat < "/proc/$pid/stat"; } 2>/dev/null || continue
      set -- ${stat##*) }
      case "$1" in T|t) held=1;; esac
    done
    if [ "$held" != "$stopped" ]; then
      stopped=$held
      if [ -n "$held" ]; then say stopped; else say running; fi
    fi
  fi
  sleep 0.25
done
"""


def report_marker(nonce: str) -> bytes:
    """What comes before each of the join reporter's reports in the task's stderr."""
    return f"\x1emgpu-{nonce} ".encode("ascii")


def new_nonce() -> str:
    """The marker's random part: no program's own output has it by chance."""
    return secrets.token_hex(8)


def join_report_command(session_id: int | str, own_port: int | None, coordinator_port: int | None,
                        nonce: str, usage_interval_cs: int = USAGE_INTERVAL_CS) -> str:
    """The command line of the join reporter for one remote task (see the module docstring):
    `exec /bin/sh -c ...`; `session_id` may be a shell word ("$$")."""
    ports = " ".join("-" if port is None else str(int(port)) for port in (own_port, coordinator_port))
    sid = session_id if isinstance(session_id, str) else str(int(session_id))
    if not nonce.isalnum():
        raise ValueError(f"bad report nonce {nonce!r}")
    return sh(_JOIN_REPORTER) + f" mgpu-join {sid} {ports} {int(usage_interval_cs)} {nonce}"


def _beside_the_task(reporter: str) -> str:
    """The wrapper's line that starts `reporter` (a join_report_command), detached, its output on
    the task's stderr. In a session of its own where the host has setsid: then neither it nor the
    commands it runs count as the task's processes, and the signals for the task's group pass it by."""
    assert reporter.startswith("exec /bin/sh ")
    run = reporter.replace("exec ", "exec $mgpu_setsid ", 1)
    return f"mgpu_setsid=$(command -v setsid); ( ( {run} </dev/null >&2 ) & )"


def parse_usage(report: str) -> tuple[float, float, float] | None:
    """(uptime s, s on a CPU, s on a CPU or waiting for one) of a USAGE report; None for another line."""
    fields = report.split()
    if len(fields) != 4 or fields[0] != USAGE or not all(field.isascii() and field.isdigit() for field in fields[1:]):
        return None
    return int(fields[1]) / 100, int(fields[2]) / 1e9, int(fields[3]) / 1e9


def env_block(env: Mapping[str, str]) -> bytes:
    """What the wrapper reads from stdin: `mgpu_vI='value'` lines, then ENV_END."""
    lines = [f"mgpu_v{i}={one_line(value)}" for i, value in enumerate(env.values())]
    return ("\n".join(lines + [ENV_END]) + "\n").encode("utf-8", "surrogateescape")


def task_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    workdir: str | None,
    grace_period: float,
    reporter: str | None = None,
) -> RemoteTask:
    """The command line that starts one task over SSH, and what to send on its stdin (see the
    module docstring); `reporter`: a join_report_command for the session "$$", started beside the
    task with its output on the task's stderr. Raises ValueError for a bad env name."""
    if not argv:
        raise ValueError("empty argv")
    names = [parse_env_name(name) for name in env]
    # A task without the launch's id (started by hand, not by the supervisor) is found by the others.
    tags = [shlex.quote(f"{name}={env[name]}") for name in TAG_NAMES if name in env]
    tags = tags if all(name in env for name in TAG_NAMES[1:]) else []
    lines = [
        "exec 3<&0 </dev/null",
        f'echo "{PGID_MARKER} $$" >&2',
        "mgpu_nl='\n'",
        "mgpu_end=",
        f'while IFS= read -r mgpu_line <&3; do [ "$mgpu_line" = {ENV_END} ] && {{ mgpu_end=1; break; }}; '
        'eval "$mgpu_line"; done',
        '[ -n "$mgpu_end" ] || exit 255',  # the launcher went away before sending the environment
        "( ( exec /bin/sh -c "
        + shlex.quote(_HANGUP_GUARD)
        + f' mgpu-guard "$$" {math.ceil(grace_period)} {" ".join(tags)} <&3 >/dev/null 2>&1 3<&- ) & )',
        "exec 3<&-",
    ]
    if reporter is not None:
        lines.append(_beside_the_task(reporter))
    if names:
        lines.append("export " + " ".join(f'{name}="$mgpu_v{i}"' for i, name in enumerate(names)))
    run = "exec " + " ".join(shlex.quote(a) for a in argv)
    if workdir:
        run = f"cd {shlex.quote(safe_workdir(workdir))} && {run}"
    lines.append(run)
    return RemoteTask(sh("\n".join(lines)), env_block(env))


# The widest an attempt number, a launch's id and a reporter's marker can be: what the length check
# measures, so that the command a start sends is never longer than the one checked.
_WIDEST_ATTEMPT = 10 ** 6
_WIDEST_LAUNCH_ID = "f" * 16  # secrets.token_hex(8), as the supervisor draws it


def longest_start_command(argv: Sequence[str], env: Mapping[str, str], workdir: str | None, grace_period: float,
                          own_port: int | None, coordinator_port: int | None) -> str:
    """The command line that starts a task over SSH (SshBackend.start) at its longest: with the
    variables every attempt adds, the launch's id, and the join reporter beside the task."""
    widest = {**env, **attempt_env(_WIDEST_ATTEMPT), ENV_LAUNCH_ID: _WIDEST_LAUNCH_ID}
    reporter = join_report_command("$$", own_port, coordinator_port, new_nonce())
    return task_command(argv, widest, workdir, grace_period, reporter).command


def split_pgid_line(line: bytes) -> tuple[bytes, int | None]:
    """(what the login shell printed before the wrapper's PGID line on the same line, the process
    group), or (line, None) if the line does not end with the PGID line. The wrapper prints it
    before the task starts, so whatever comes before it is the login shell's, never the task's."""
    found = line.rfind(PGID_MARKER.encode() + b" ")
    if found < 0:
        return line, None
    number = line[found + len(PGID_MARKER) + 1:].rstrip(b"\r\n")
    if number.isascii() and number.isdigit():
        return line[:found], int(number)
    return line, None


def signal_command(pgids: Iterable[int], signum: int) -> str:
    """Signal remote tasks' whole process groups; quiet for groups already gone. Before SIGABRT
    (the request for stacks, whose default action dumps core) the groups' core file limits are
    lowered to 0 with util-linux's prlimit, where the host has it and pgrep, and after it the groups
    are continued."""
    pgids = [int(pgid) for pgid in pgids]
    name = signal.Signals(signum).name.removeprefix("SIG")
    groups = " ".join(f"-{pgid}" for pgid in pgids)
    no_cores = ""
    if signum == signal.SIGABRT:
        listed = ",".join(str(pgid) for pgid in pgids)
        no_cores = f'for p in $(pgrep -g {listed} 2>/dev/null); do prlimit --pid "$p" --core=0: 2>/dev/null; done; '
    # A stopped group (SIGSTOP) takes the SIGABRT once continued: its stacks are where it stopped.
    cont = f"; kill -CONT {groups} 2>/dev/null" if signum == signal.SIGABRT else ""
    return sh(f"{no_cores}kill -{name} {groups} 2>/dev/null{cont}; exit 0")
