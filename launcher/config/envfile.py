"""Env files: NAME=VALUE lines, as shell and dotenv files write them."""

from __future__ import annotations

from launcher.config.addresses import parse_env_assignment
from launcher.errors import SpecError


def parse_env_file(text: str, source: str) -> dict[str, str]:
    """NAME=VALUE lines, with blank lines and # comments; an `export ` prefix and one pair of
    quotes around the value are allowed, as in shell and dotenv files."""
    env = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, value = parse_env_assignment(line.removeprefix("export "))
        except ValueError as exc:
            raise SpecError(f"{source}:{number}: {exc}") from None
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name] = value
    return env
