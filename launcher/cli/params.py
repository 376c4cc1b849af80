"""click ParamTypes over the pure parsers of launcher.config.addresses.

Bad input is refused at parse time, before anything is planned or started.
"""

from __future__ import annotations

import math

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


MAX_SECONDS = 30 * 24 * 3600.0  # a month: longer waits are mistakes, and inf or nan would hang or crash


class Seconds(click.ParamType):
    """A finite number of seconds within [minimum, MAX_SECONDS] (click's FloatRange takes nan and inf)."""

    name = "seconds"

    def __init__(self, minimum: float):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if not self.minimum <= number <= MAX_SECONDS:
            self.fail(f"{value!r} is not between {self.minimum:g} and {MAX_SECONDS:g} seconds", param, ctx)
        return number


def _env_name_or_prefix(text: str) -> str:
    """`NAME`, or `PREFIX*` for every variable whose name starts with PREFIX (`NCCL_*`)."""
    if text.endswith("*"):
        parse_env_name(text[:-1])
        return text
    return parse_env_name(text)


def _task_selectors(text: str) -> frozenset[str]:
    return frozenset(parse_task_selector(part.strip()) for part in text.split(","))


ENDPOINT = ParsedParam("[user@]host[:port]", parse_endpoint)
ENDPOINT_LIST = ParsedParam("host:port,...", parse_worker_list)
SLOTS_LIST = ParsedParam("host:slots,...", parse_slots_list)
PORT = ParsedParam("port", parse_port)
ENV_ASSIGNMENT = ParsedParam("NAME=VALUE", parse_env_assignment)
ENV_NAME = ParsedParam("NAME", parse_env_name)
ENV_NAME_OR_PREFIX = ParsedParam("NAME or PREFIX*", _env_name_or_prefix)
TASK_SELECTORS = ParsedParam("type[:index],...", _task_selectors)
RUN_ID = ParsedParam("run-id", parse_run_id)
