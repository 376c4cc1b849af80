"""The `mgpu launch` command line as run.json records it and the report shows it: the arguments as
given, with the values that carry secrets replaced by ***, since run.json is read by the user's
tools and the report is mailed around.

Hidden: each --env's value (its name kept, as the dry run shows it), the --notify command and the
--notify-url (a webhook's URL is its password), and the --setup and --health-check commands (a
private index's token, say); with --show-secrets the --env values are shown, as in the plans. The
program's own arguments after `--` are kept: run.json's plans hold them already. The line is
bounded: at most MAX_ARGS arguments of at most MAX_ARG characters each.
"""

from __future__ import annotations

from typing import Sequence

HIDDEN = "***"
MAX_ARGS = 500
MAX_ARG = 4096
# Options whose whole value is hidden, and the one whose value is NAME=VALUE.
SECRET_VALUES = ("--notify", "--notify-url", "--setup", "--health-check")
ENV = "--env"


def _env(value: str, show_secrets: bool) -> str:
    name, sep, _ = value.partition("=")
    return value if show_secrets or not sep else f"{name}={HIDDEN}"


def recorded(args: Sequence[str], show_secrets: bool = False, program: str = "mgpu") -> tuple[str, ...]:
    """`program` and `args` (what followed it), with the secret-bearing values hidden."""
    out: list[str] = [program]
    hide_next: str | None = None  # the option whose value comes next
    mine = True  # before the `--` that starts the program's arguments
    for arg in args:
        if hide_next is not None:
            out.append(_env(arg, show_secrets) if hide_next == ENV else HIDDEN)
            hide_next = None
        elif mine and arg == "--":
            mine = False
            out.append(arg)
        elif mine and arg in (*SECRET_VALUES, ENV):
            hide_next = arg
            out.append(arg)
        elif mine and arg.startswith(ENV + "="):
            out.append(f"{ENV}={_env(arg[len(ENV) + 1:], show_secrets)}")
        elif mine and arg.startswith(tuple(option + "=" for option in SECRET_VALUES)):
            out.append(f"{arg.partition('=')[0]}={HIDDEN}")
        else:
            out.append(arg)
    if len(out) > MAX_ARGS:
        out = out[:MAX_ARGS - 1] + [f"... ({len(out) - MAX_ARGS + 1} more arguments)"]
    return tuple(arg if len(arg) <= MAX_ARG else arg[:MAX_ARG - 1] + "…" for arg in out)
