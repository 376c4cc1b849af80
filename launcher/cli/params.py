"""click ParamTypes over the pure parsers of launcher.config.addresses.

Bad input is refused at parse time, before anything is planned or started.
"""

from __future__ import annotations

import math

import click

from launcher.config.quarantine import parse_duration
from launcher.config.spec import MAX_SECONDS
from launcher.exit_codes import parse_text as parse_exit_codes
from launcher.config.addresses import (
    parse_endpoint, parse_env_assignment, parse_env_name, parse_host_list, parse_port, parse_run_id,
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




class Seconds(click.ParamType):
    """A finite number of seconds within [minimum, MAX_SECONDS] (click's FloatRange takes nan and inf)."""

    name = "seconds"

    def __init__(self, minimum: float):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        try:
            if isinstance(value, str) and not value.isascii():  # float() also reads '٣'
                raise ValueError(value)
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if not self.minimum <= number <= MAX_SECONDS:
            self.fail(f"{value!r} is not between {self.minimum:g} and {MAX_SECONDS:g} seconds", param, ctx)
        return number


class Count(click.IntRange):
    """click's IntRange with ASCII digits only (int(), and so IntRange, also reads '٣')."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.isascii():
            self.fail(f"{value!r} is not a number (ASCII digits)", param, ctx)
        return super().convert(value, param, ctx)


def _env_name_or_prefix(text: str) -> str:
    """`NAME`, or `PREFIX*` for every variable whose name starts with PREFIX (`NCCL_*`)."""
    if text.endswith("*"):
        parse_env_name(text[:-1])
        return text
    return parse_env_name(text)


def _task_selectors(text: str) -> frozenset[str]:
    return frozenset(parse_task_selector(part.strip()) for part in text.split(","))


class InputFile(click.ParamType):
    """A file option: a regular file (not a FIFO, device or directory) of at most `limit` bytes,
    checked when the option is parsed; the readers enforce the same limits as they read."""

    name = "file"

    def __init__(self, limit: int | None = None, must_exist: bool = True):
        from launcher.host.files import MAX_INPUT_BYTES

        self.limit = limit or MAX_INPUT_BYTES
        self.must_exist = must_exist

    def convert(self, value, param, ctx):
        from launcher.host.files import check_input_file

        if not isinstance(value, str):
            return value
        option = param.opts[0] if param is not None and param.opts else "file"
        check_input_file(value, option, self.limit, self.must_exist)
        return value


def _byte_size(text: str) -> int:
    """A size in bytes: a number with an optional K, M, G or T (powers of 1024), e.g. 2G, 500M."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.strip().upper().removesuffix("B").removesuffix("I"), ""
    if number[-1:] in units:
        number, unit = number[:-1], number[-1:]
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a size (write it as 500M, 2G or a number of bytes)") from None
    if not 0 < value < 1 << 50:
        raise ValueError(f"{text!r}: give a size above 0 and below 1 PB")
    return int(value)


BYTE_SIZE = ParsedParam("size", _byte_size)
ENDPOINT = ParsedParam("[user@]host[:port]", parse_endpoint)
ENDPOINT_LIST = ParsedParam("host:port,...", parse_worker_list)
HOST_LIST = ParsedParam("host,...", parse_host_list)
SLOTS_LIST = ParsedParam("host:slots,...", parse_slots_list)
PORT = ParsedParam("port", parse_port)
ENV_ASSIGNMENT = ParsedParam("NAME=VALUE", parse_env_assignment)
ENV_NAME_OR_PREFIX = ParsedParam("NAME or PREFIX*", _env_name_or_prefix)
TASK_SELECTORS = ParsedParam("type[:index],...", _task_selectors)
RUN_ID = ParsedParam("run-id", parse_run_id)
DURATION = ParsedParam("duration", parse_duration)
EXIT_CODES = ParsedParam("CODE=ACTION,...", parse_exit_codes)


def _notify_url(text: str) -> str:
    from launcher.supervise.notify import check_url  # only a launch that posts notices loads it

    return check_url(text)


NOTIFY_URL = ParsedParam("URL", _notify_url)
