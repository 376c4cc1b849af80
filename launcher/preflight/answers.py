"""A host's answer to a check, read as data from elsewhere.

host/probe.py prints one JSON object, but what reaches this machine is whatever the host's session
wrote: a user's start-up file, a `python3` first on its PATH or the host itself may answer anything.
So the answer's size and nesting are bounded, every field the launcher reads is checked for its
type and range, and every text is made safe for a terminal (console_safe) as it is read: the
table, the error lines and `--json` show it as it came, control characters escaped. An answer that
fails is an UnreadableAnswer naming what is wrong; the host fails its check with it (exit 1).
"""

from __future__ import annotations

import json
import math

from launcher.errors import UnreadableAnswer
from launcher.supervise.console_text import console_safe

# Bytes kept of a preflight command's stdout, and of its stderr: a start-up file's banner and the
# probe's answer. The answer of a host that dials 64 tasks and has a thousand addresses is under 100 KB.
OUTPUT_LIMIT = 4 << 20
ANSWER_LIMIT = 1 << 20  # characters of the answer's line
NAME_LIMIT = 100  # a version, an interface name, an address
TEXT_LIMIT = 1000  # an error's text (the probe sends an exception's first line); longer is cut
GPU_LIMIT = 1 << 16
LIST_LIMIT = 200  # modules a program imports, addresses of a host's name
FIGURE_LIMIT = 1e12  # GFLOP/s, MB/s
_SPEED_ERRORS = ("error", "send_error", "cpu_error", "gpu_error")


def unreadable(host: str, what: str, reason: str) -> UnreadableAnswer:
    """The one line that says a host's answer cannot be read."""
    return UnreadableAnswer(f"host {host} answered the {what} with something mgpu cannot read: {reason}")


def _no_constant(name: str) -> float:
    raise UnreadableAnswer(f"{name} is not a number mgpu reads")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnreadableAnswer(f"{text[:20]} is out of range")
    return value


def last_json(out: bytes) -> dict | None:
    """The last line of `out` that starts with "{", parsed; None when there is none or it is not JSON
    (a login script may print before the probe does). UnreadableAnswer (its reason only) when that
    line is too long, too deeply nested, or holds NaN, an infinity or a number too long to read."""
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        if len(line) > ANSWER_LIMIT:
            raise UnreadableAnswer(f"a line of {len(line)} characters (at most {ANSWER_LIMIT})")
        try:
            return json.loads(line, parse_constant=_no_constant, parse_float=_finite)
        except json.JSONDecodeError:
            return None
        except RecursionError:
            raise UnreadableAnswer("JSON nested too deeply") from None
        except ValueError:  # an integer of more digits than Python converts (4,300)
            raise UnreadableAnswer("a number of too many digits") from None
    return None


class _Fields:
    """A JSON object from a host, read field by field: each read checks its field's type and range."""

    def __init__(self, data: object, what: str):
        if not isinstance(data, dict):
            raise UnreadableAnswer(f"{what} is {_kind(data)}, not an object")
        self._data = data
        self._what = what

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def _wrong(self, key: str, wanted: str) -> UnreadableAnswer:
        return UnreadableAnswer(f"{self._name(key)} is {_kind(self._data[key])}, not {wanted}")

    def _name(self, key: str) -> str:
        return key if self._what == "the answer" else f"{self._what}.{key}"

    def flag(self, key: str) -> bool:
        value = self._data.get(key, False)
        if not isinstance(value, bool):
            raise self._wrong(key, "true or false")
        return value

    def name(self, key: str) -> str:
        value = self._data[key]
        if not isinstance(value, str) or len(value) > NAME_LIMIT:
            raise self._wrong(key, f"a text of at most {NAME_LIMIT} characters")
        return console_safe(value)

    def text(self, key: str) -> str:
        value = self._data[key]
        if not isinstance(value, str):
            raise self._wrong(key, "a text")
        return _cut(value)

    def texts(self, key: str) -> list[str]:
        values = self._data.get(key, [])
        if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
            raise self._wrong(key, "a list of texts")
        return [_cut(value) for value in values]

    def count(self, key: str, high: int) -> int | None:
        value = self._data.get(key)
        if value is None:
            return None
        if not _is_int(value) or not 0 <= value <= high:
            raise self._wrong(key, f"a count from 0 to {high}")
        return value

    def ports(self, key: str) -> list[int]:
        values = self._data.get(key, [])
        if not isinstance(values, list) or not all(_is_int(port) and 0 < port < 65536 for port in values):
            raise self._wrong(key, "a list of ports")
        return values

    def figure(self, key: str) -> float | None:
        value = self._data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= FIGURE_LIMIT:
            raise self._wrong(key, f"a figure from 0 to {FIGURE_LIMIT:g}")
        return float(value)

    def texts_by_name(self, key: str, empty: bool = False) -> dict[str, str | None]:
        """An object of texts (None where `empty` allows null) by short names (ports, targets)."""
        values = self._data.get(key, {})
        if not isinstance(values, dict) or not all(
                len(name) <= NAME_LIMIT and (isinstance(value, str) or (empty and value is None))
                for name, value in values.items()):
            raise self._wrong(key, "an object of texts")
        return {console_safe(name): None if value is None else _cut(value) for name, value in values.items()}

    def pairs(self, key: str) -> list[tuple[str, str]]:
        values = self._data.get(key) or []
        if not isinstance(values, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) and len(x) <= NAME_LIMIT for x in pair)
                for pair in values):
            raise self._wrong(key, "a list of [address, interface] pairs")
        return [(console_safe(address), console_safe(name)) for address, name in values]

    def part(self, key: str) -> object:
        return self._data[key]


def check_answer(data: object) -> dict:
    """The host check's answer (host/probe.py's probe, or one of the shell's `*_missing` lines), with
    the reachability test's under reach and the speed probe's under speed where they ran."""
    fields = _Fields(data, "the answer")
    result: dict = {key: True for key in ("workdir_missing", "program_missing", "python_missing") if fields.flag(key)}
    for key in ("python", "tensorflow", "tf_keras"):
        if key in fields:
            result[key] = fields.name(key)
    for key in ("tensorflow_error", "tf_keras_error", "py_spy"):
        if key in fields:
            result[key] = fields.text(key)
    result["missing_modules"] = fields.texts("missing_modules")
    result.update(program_answer(fields))
    result["busy_ports"] = fields.ports("busy_ports")
    result["gpus"] = fields.count("gpus", GPU_LIMIT)
    if "reach" in fields:
        result["reach"] = reach_answer(fields.part("reach"), "reach")
    if "speed" in fields:
        result["speed"] = speed_answer(fields.part("speed"), "speed")
    return result


def program_answer(fields: _Fields) -> dict:
    """What the host check found of the task's own program and of the host's own name
    (host/probe/program_check.py), where it looked."""
    result: dict = {}
    for key in ("executable", "own_name_error"):
        if key in fields:
            result[key] = fields.text(key)
    for key in ("own_name", "keras_backend"):
        if key in fields:
            result[key] = fields.name(key)
    for key in ("imports", "imports_missing", "own_addresses"):
        if key in fields:
            values = fields.texts(key)
            if len(values) > LIST_LIMIT or any(len(value) > NAME_LIMIT for value in values):
                raise UnreadableAnswer(f"{key} is not a list of at most {LIST_LIMIT} short names")
            result[key] = values
    return result


def reach_answer(data: object, what: str = "the answer") -> dict:
    """The reachability test's answer (see host/probe.py's reach), with the speed probe's under
    speed where it ran after it."""
    fields = _Fields(data, what)
    result = {"listen_errors": fields.texts_by_name("listen_errors"), "reach": fields.texts_by_name("reach"),
              "dialed": fields.texts_by_name("dialed", empty=True), "addresses": fields.pairs("addresses")}
    if "speed" in fields:
        result["speed"] = speed_answer(fields.part("speed"), "speed")
    return result


def speed_answer(data: object, what: str) -> dict:
    """The speed probe's answer: its figures (None where not measured) and what could not be."""
    fields = _Fields(data, what)
    result: dict = {key: fields.figure(key) for key in ("cpu_gflops", "gpu_gflops", "send_mbps")}
    for key in _SPEED_ERRORS:
        if key in fields and fields.part(key) is not None:
            result[key] = fields.text(key)
    return result


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cut(text: str) -> str:
    """`text` safe for a terminal, cut to TEXT_LIMIT characters."""
    return console_safe(text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "...")


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a text", bool: "true or false", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), "something else")
