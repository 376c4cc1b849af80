"""click ParamTypes over the pure parsers of launcher.config.addresses.

Bad input is refused at parse time, before anything is planned or started.
"""

from __future__ import annotations

import click

from launcher.config.addresses import (
    parse_endpoint, parse_env_assignment, parse_env_name, parse_port, parse_run_id,
    parse_slots_list, parse_task_selector, parse_worker_list,
)


class ParsedParam(click.ParamType):
    """A ParamType backed by a pure parse function that raises ValueError with its message."""

    def __init__(self, name: str, parse):
        self.name = name
        self._parse = parse

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value  # already converted (a default, or a value set from Python)
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _task_selectors(text: str) -> frozenset[str]:
    return frozenset(parse_task_selector(part.strip()) for part in text.split(","))


ENDPOINT = ParsedParam("[user@]host[:port]", parse_endpoint)
ENDPOINT_LIST = ParsedParam("host:port,...", parse_worker_list)
SLOTS_LIST = ParsedParam("host:slots,...", parse_slots_list)
PORT = ParsedParam("port", parse_port)
ENV_ASSIGNMENT = ParsedParam("NAME=VALUE", parse_env_assignment)
ENV_NAME = ParsedParam("NAME", parse_env_name)
TASK_SELECTORS = ParsedParam("type[:index],...", _task_selectors)
RUN_ID = ParsedParam("run-id", parse_run_id)
