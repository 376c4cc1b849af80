"""Shell quoting for command lines mgpu hands to /bin/sh, on this machine or through SSH."""

from __future__ import annotations

import shlex


def sh(script: str) -> str:
    """A command line for any POSIX-like login shell that runs `script` in /bin/sh.

    A remote account's login shell may be csh or fish: only this one command line is parsed by
    it, and everything else by /bin/sh."""
    return "exec /bin/sh -c " + shlex.quote(script)


def one_line(value: str) -> str:
    """`value` quoted for sh on a single line (newlines become "$mgpu_nl" outside the quotes)."""
    return shlex.quote(value).replace("\n", "'\"$mgpu_nl\"'")


def safe_workdir(workdir: str) -> str:
    """A workdir that cd cannot take for an option (`-P`, `-`)."""
    return "./" + workdir if workdir.startswith("-") else workdir
