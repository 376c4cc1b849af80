"""Asking py-spy for the stacks of a task's processes, where the task runs, without stopping it.

py-spy (a maintained sampling profiler with binary wheels) reads a live Python process's stacks
from outside it, through ptrace: every thread, the Python frames and, with --native, the C and C++
frames below them (where a collective of TensorFlow, gloo or NCCL waits). The process goes on.

One shell script does it on every host, on this machine as over SSH: it says where py-spy is (the
program MGPU_PY_SPY names, else py-spy on PATH, else beside the task's Python), the host's Yama
ptrace_scope, and for each process (a list of ids, or a task's tree on its host) py-spy's JSON
dump and exit status, each under `timeout`, each cut to DUMP_LIMIT bytes, between marker lines of
a random word that no dump carries. What comes back is read as untrusted text (parse_answer);
standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shlex
import subprocess
import sys
from typing import Sequence

# Where py-spy is, for every host of a run: a path, or empty for none (stacks by SIGABRT alone).
ENV_PY_SPY = "MGPU_PY_SPY"
DUMP_TIMEOUT = 20  # seconds one process's dump may take (--native on a large process takes seconds)
DUMP_LIMIT = 2 << 20  # bytes of one process's dump that are read
MAX_PROCESSES = 16  # of one task
NOT_FOUND = 127  # py-spy's status where the host has none
TIMED_OUT = 124  # coreutils timeout's


@dataclasses.dataclass(frozen=True)
class Dump:
    """py-spy's answer for one process: its exit status and what it printed (stdout and stderr)."""
    pid: int
    status: int
    text: str
    owner: int | None = None  # the process's user id, as the host said


@dataclasses.dataclass(frozen=True)
class Answer:
    """What one host answered for one task."""
    spy: str | None  # the py-spy that ran; None: the host has none
    dumps: tuple[Dump, ...] = ()
    ptrace_scope: int | None = None  # kernel.yama.ptrace_scope; None: no Yama
    uid: int | None = None  # the user py-spy ran as
    problem: str | None = None  # why nothing came back (a timeout, a lost connection)
    states: tuple[tuple[int, str], ...] = ()  # (pid, state letter of /proc/PID/stat): said with or without py-spy

    def stopped(self) -> bool:
        """Whether a process of the task is stopped: state T (SIGSTOP) or t (a debugger)."""
        return any(state in ("T", "t") for _, state in self.states)


def configured() -> str | None:
    """MGPU_PY_SPY as this machine's environment sets it: None when unset."""
    return os.environ.get(ENV_PY_SPY)


def listing_of_pids(pids: Sequence[int]) -> str:
    """The shell words that list these processes."""
    return "echo " + " ".join(str(int(p)) for p in pids[:MAX_PROCESSES])


def listing_of_tree(pgid: int) -> str:
    """The shell words that list a task's whole tree on its host (a task over SSH): the members of
    its process group and, by parent pid, every descendant of theirs, those that started a session
    or group of their own too, as a task on this machine is read. Where ps is missing, the group's
    members alone (pgrep)."""
    g = int(pgid)
    # A pass adds each process whose parent is in the tree; at most as many passes as processes.
    tree = ("ps -e -o pid= -o ppid= -o pgid= 2>/dev/null | awk -v g=" + str(g) + " '"
            "{ pid[NR] = $1; ppid[NR] = $2; if ($3 == g) inside[$1] = 1 } "
            "END { do { more = 0; for (i = 1; i <= NR; i++) "
            "if (!(pid[i] in inside) && (ppid[i] in inside)) { inside[pid[i]] = 1; more = 1 } } while (more); "
            "for (i = 1; i <= NR; i++) if (pid[i] in inside) print pid[i] }'")
    return (f"{{ l=$({tree}); [ -n \"$l\" ] || l=$(pgrep -g {g} 2>/dev/null); printf '%s\\n' $l; }}"
            f" | head -n {MAX_PROCESSES}")


# scontrol listpids finds the node it runs on by this machine's host name unless it is given the
# node's name, which Slurm gives every task of a step (SLURMD_NODENAME): a node whose NodeName is not
# its host name would list nothing.
SLURM_NODE_WORD = '${SLURMD_NODENAME:+"$SLURMD_NODENAME"}'


def listing_of_slurm_task(step_id: str, rank: int) -> str:
    """The shell words that list the processes of task `rank` of a Slurm step, on its node."""
    if not re.fullmatch(r"\d+\.\d+", step_id):
        raise ValueError(f"bad step id {step_id!r}")
    return (f"scontrol listpids {step_id} {SLURM_NODE_WORD} 2>/dev/null "
            f"| awk 'NR > 1 && $5 == {int(rank)} {{ print $1 }}' | head -n {MAX_PROCESSES}")


def script(listing: str, native: bool, pythons: Sequence[str], nonce: str, spy: str | None = None) -> str:
    """The /bin/sh script that dumps the processes `listing` lists (listing_of_*); `pythons`: the
    task's interpreter and others, beside which py-spy may be installed (a relative path is the
    task's own, from the folder the script runs in); `spy`: MGPU_PY_SPY's value, if set."""
    mark = f"\x1emgpu-spy-{nonce}"
    beside = [os.path.join(os.path.dirname(python), "py-spy") for python in pythons if "/" in python]
    tries = "".join(f'[ -n "$spy" ] || {{ [ -x {shlex.quote(path)} ] && spy={shlex.quote(path)}; }}; '
                    for path in dict.fromkeys(beside))
    find = (f"spy={shlex.quote(spy)}" if spy is not None else
            f'spy=$(command -v py-spy 2>/dev/null); {tries}:')
    flags = "--json --full-filenames" + (" --native" if native else "")
    return _script(listing, find, flags, mark)


def _script(listing: str, find: str, flags: str, mark: str) -> str:
    # Each dump goes to a file of its own first: its exit status is py-spy's, and its size is cut
    # before it is sent.
    return "\n".join([
        find,
        f"printf '{mark} scope %s\\n' \"$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo -)\"",
        f"printf '{mark} uid %s\\n' \"$(id -u)\"",
        # Each process's state (the letter after the command's closing parenthesis), py-spy or not:
        # a stopped task is named as the one the others wait for.
        f"for p in $({listing}); do",
        f"  printf '{mark} state %s %s\\n' \"$p\" \"$(sed -n 's/.*) \\(.\\).*/\\1/p' /proc/$p/stat 2>/dev/null)\"",
        "done",
        f'if [ -z "$spy" ] || ! [ -x "$spy" ]; then printf \'{mark} missing\\n\'; exit 0; fi',
        f"printf '{mark} spy %s\\n' \"$spy\"",
        f't=; command -v timeout >/dev/null 2>&1 && t="timeout -s KILL {DUMP_TIMEOUT}"',
        'f=$(mktemp) || exit 1',
        "trap 'rm -f \"$f\"' EXIT",
        f"for p in $({listing}); do",
        "  o=$(stat -c %u /proc/$p 2>/dev/null || echo -)",
        f'  $t "$spy" dump {flags} --pid "$p" >"$f" 2>&1 </dev/null',
        "  s=$?",
        f"  printf '{mark} pid %s %s %s\\n' \"$p\" \"$s\" \"$o\"",
        f'  head -c {DUMP_LIMIT} "$f"',
        "  echo",
        "done",
        f"printf '{mark} end\\n'",
    ])


def new_nonce() -> str:
    return secrets.token_hex(8)


_NUMBER = re.compile(r"^-?\d{1,10}$")


def _number(text: str) -> int | None:
    return int(text) if _NUMBER.match(text) else None


def parse_answer(out: bytes, nonce: str) -> Answer:
    """The script's output, read as untrusted: only marker lines of this nonce count; each dump's
    text is what lies between its marker line and the next, cut to DUMP_LIMIT."""
    mark = f"\x1emgpu-spy-{nonce} "
    text = out.decode("utf-8", "replace")
    spy: str | None = None
    missing = False
    scope = uid = None
    dumps: list[Dump] = []
    states: list[tuple[int, str]] = []
    current: tuple[int, int, int | None] | None = None
    body: list[str] = []

    def end_dump() -> None:
        if current is not None:
            dumps.append(Dump(current[0], current[1], "".join(body)[:DUMP_LIMIT], current[2]))

    # Not str.splitlines: it also splits at the marker's own \x1e.
    for line in (piece + "\n" for piece in text.split("\n")):
        if not line.startswith(mark):
            if current is not None:
                body.append(line)
            continue
        fields = line[len(mark):].split()
        kind, args = (fields[0], fields[1:]) if fields else ("", [])
        if kind == "pid" and len(args) == 3 and _number(args[0]) is not None and _number(args[1]) is not None:
            end_dump()
            current, body = (_number(args[0]), _number(args[1]), _number(args[2])), []
        elif kind in ("end", "pid"):
            end_dump()
            current, body = None, []
        elif kind == "state" and len(args) == 2 and _number(args[0]) is not None and re.fullmatch("[A-Za-z]", args[1]):
            states.append((_number(args[0]), args[1]))
        elif kind == "scope" and args:
            scope = _number(args[0])
        elif kind == "uid" and args:
            uid = _number(args[0])
        elif kind == "spy" and args:
            spy = " ".join(args)[:4096]
        elif kind == "missing":
            missing = True
    end_dump()
    if missing or spy is None:
        return Answer(None, ptrace_scope=scope, uid=uid, states=tuple(states[:MAX_PROCESSES]))
    return Answer(spy, tuple(dumps[:MAX_PROCESSES]), scope, uid, states=tuple(states[:MAX_PROCESSES]))


def run_here(pids: Sequence[int], native: bool, python: str | None, timeout: float, workdir: str | None = None) -> Answer:
    """The script on this machine, for the processes `pids`, in the task's `workdir`; py-spy also
    beside mgpu's own Python (installed with it: `pip install mgpu[stacks]`)."""
    nonce = new_nonce()
    pythons = [python] if python else []
    try:
        done = subprocess.run(["/bin/sh", "-c", script(listing_of_pids(pids), native, [*pythons, sys.executable], nonce,
                                                       configured())], cwd=workdir if workdir else None,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Answer(None, problem=f"py-spy did not answer within {timeout:g} s")
    except OSError as e:
        return Answer(None, problem=f"cannot run /bin/sh: {e.strerror or e}")
    return parse_answer(done.stdout, nonce)
