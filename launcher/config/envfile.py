"""Env files, in python-dotenv's syntax (https://pypi.org/project/python-dotenv/).

`NAME=VALUE` per line, `export ` allowed before it, `# comments` after unquoted values and on
lines of their own; single-quoted values are literal, double-quoted ones may span lines and
take escapes such as `\\n`. Values are used as written: `${VAR}` is not expanded (a task's
environment never depends on the launcher's by accident; --forward-env passes variables on).
A line python-dotenv cannot parse, a name without a value, and a name that is not a valid
variable name are errors that name the file, the line and the variable, never the value.
"""

from __future__ import annotations

import io

from launcher.config.addresses import parse_env_name
from launcher.errors import SpecError


def parse_env_file(text: str, source: str) -> dict[str, str]:
    """The variables of an env file. An error names the file, the line and the variable, never
    a value: env files hold secrets, and errors reach consoles and CI logs."""
    # Imported here: python-dotenv brings logging and tempfile, about 9 ms of the 125 of every
    # mgpu command's start, and most commands read no env file.
    from dotenv.parser import parse_stream

    env = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.key is None and not binding.error:
            continue  # a blank line or a comment
        lines = binding.original.string.splitlines()
        blank = next((n for n, line in enumerate(lines) if line.strip()), 0)  # dotenv's binding begins with them
        where = f"{source}:{binding.original.line + blank}"
        first_line = lines[blank] if lines else ""
        if "=" not in first_line:  # what is there may be a value pasted alone
            raise SpecError(f"{where}: the line is not NAME=VALUE (it has no '=')")
        if binding.error:
            raise SpecError(f"{where}: the value of {_name(first_line)} cannot be parsed (an unclosed quote?); "
                            f"lines are NAME=VALUE, as in python-dotenv")
        try:
            env[parse_env_name(binding.key)] = binding.value
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
    return env


def _name(line: str) -> str:
    """The variable a NAME=VALUE line sets, when what is before its '=' is a valid name."""
    name = line.split("=", 1)[0].strip().removeprefix("export ").strip()
    try:
        return parse_env_name(name)
    except ValueError:
        return "the variable on this line"
