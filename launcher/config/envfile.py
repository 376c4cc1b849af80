"""Env files, in python-dotenv's syntax (https://pypi.org/project/python-dotenv/).

`NAME=VALUE` per line, `export ` allowed before it, `# comments` after unquoted values and on
lines of their own; single-quoted values are literal, double-quoted ones may span lines and
take escapes such as `\\n`. Values are used as written: `${VAR}` is not expanded (a task's
environment never depends on the launcher's by accident; --forward-env passes variables on).
A line python-dotenv cannot parse, a name without a value, and a name that is not a valid
variable name are errors that name the file and the line.
"""

from __future__ import annotations

import io

from dotenv.parser import parse_stream

from launcher.config.addresses import parse_env_name
from launcher.errors import SpecError


def parse_env_file(text: str, source: str) -> dict[str, str]:
    env = {}
    for binding in parse_stream(io.StringIO(text)):
        where = f"{source}:{binding.original.line}"
        first_line = binding.original.string.splitlines()[0] if binding.original.string else ""
        if binding.error and "=" not in first_line:
            raise SpecError(f"{where}: {first_line.strip()!r} is not NAME=VALUE")
        if binding.error:
            raise SpecError(f"{where}: cannot parse {first_line!r} (an unclosed quote?); "
                            f"lines are NAME=VALUE, as in python-dotenv")
        if binding.key is None:
            continue  # a blank line or a comment
        if binding.value is None:
            raise SpecError(f"{where}: {first_line.strip()!r} is not NAME=VALUE")
        try:
            env[parse_env_name(binding.key)] = binding.value
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
    return env
