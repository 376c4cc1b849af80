"""The command that relaunches a run without the hosts left out."""

from __future__ import annotations

import shlex
from typing import Sequence

from launcher.config.addresses import parse_endpoint

# Options whose values list hosts, and those a relaunch leaves out: the run id is taken, and the
# fewest hosts the run went on with may be more than are left.
_HOST_LIST_OPTIONS = ("--workers", "--hosts", "--chief", "--evaluator", "--spare-hosts")
_FILE_OPTIONS = ("--spec", "--hostfile")
_DROPPED = ("--run-id", "--min-hosts")


def relaunch_command(argv: Sequence[str], hosts: str | Sequence[str]) -> str | None:
    """`mgpu ARGS` without `hosts` in its host lists (and without the run id, which is taken, or
    --min-hosts); for hosts from a file, which file to remove them from. None without the command line."""
    if not argv:
        return None
    left_out = {hosts} if isinstance(hosts, str) else set(hosts)
    words: list[str] = []
    files: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            words.extend(argv[i:])
            break
        name, eq, value = arg.partition("=")
        takes_value = name in _HOST_LIST_OPTIONS + _FILE_OPTIONS + _DROPPED
        if takes_value and not eq:
            if i + 1 >= len(argv):
                words.append(arg)
                break
            value = argv[i + 1]
            i += 1
        i += 1
        if not takes_value:
            words.append(arg)
        elif name in _HOST_LIST_OPTIONS:
            kept = [entry for entry in value.split(",") if _entry_host(entry) not in left_out]
            if kept:
                words.extend([name, ",".join(kept)])
        elif name in _FILE_OPTIONS:
            files.append(value)
            words.extend([name, value])
    command = "mgpu " + shlex.join(words)
    if files:
        named = hosts if isinstance(hosts, str) else ", ".join(hosts)
        return f"{command}  (after removing {named} from {', '.join(files)})"
    return command


def _entry_host(entry: str) -> str | None:
    try:
        return parse_endpoint(entry).host
    except ValueError:
        return None
