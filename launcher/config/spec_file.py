"""Spec files (YAML or JSON): the schema documented in docs/hosts.md, checked key by key.

Every problem is one SpecError naming the file and the key.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import NoReturn

from launcher.config.addresses import Endpoint, parse_endpoint, parse_env_name, parse_host, parse_port
from launcher.config.hostlist import MAX_TASKS, check_task_total, count_entry, expand_entry
from launcher.config.spec import (
    CHIEF, MAX_GPUS_PER_TASK, MAX_MIN_HOSTS, MAX_SECONDS, MAX_THREADS_PER_TASK, PS, WORKER, ClusterSpec, SshSettings, TaskSpec, build_tasks,
)
from launcher.config.quarantine import parse_duration
from launcher.errors import SpecError
from launcher.exit_codes import ExitRule, parse_mapping

_TOP_KEYS = {
    "cluster", "evaluator", "port", "ssh", "hosts", "command", "trainer_args", "env", "workdir",
    "python", "threads_per_task", "gpus_per_task", "legacy_keras", "stall_timeout", "tensorboard",
    "sync", "setup", "setup_timeout", "spares", "health_check", "exit_codes", "min_hosts",
    "health_check_timeout", "quarantine",
}
_SSH_KEYS = {"user", "port", "identity_file", "proxy_jump"}
_HOST_KEYS = _SSH_KEYS | {"address"}  # per host: SSH settings, and the address the other tasks dial


class _Reader:
    """Typed reads of a loaded document; every failure names the file and the key."""

    def __init__(self, source: str):
        self.source = source
        self.task_total = 0  # hosts listed so far, counted before each entry is expanded

    def fail(self, message: str) -> NoReturn:
        raise SpecError(f"{self.source}: {message}")

    def mapping(self, value: object, what: str, allowed: set[str] | None = None) -> dict:
        if not isinstance(value, dict):
            self.fail(f"{what} must be a mapping")
        for key in value:
            if not isinstance(key, str):
                self.fail(f"{what}: key {key!r} is not a string")
            if allowed is not None and key not in allowed:
                self.fail(f"unknown key {key!r} in {what} (known keys: {', '.join(sorted(allowed))})")
        return value

    def string(self, value: object, what: str) -> str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(f"{what} must be a string")
        text = str(value)
        if "\0" in text or not text.isprintable() and any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            self.fail(f"{what}: {text!r} contains a NUL character or an unpaired surrogate")
        return text

    def count(self, value: object, what: str, minimum: int, maximum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
            self.fail(f"{what} must be a whole number >= {minimum} and <= {maximum}")
        return value

    def flag(self, value: object, what: str) -> bool:
        if not isinstance(value, bool):
            self.fail(f"{what} must be true or false")
        return value

    def seconds(self, value: object, what: str) -> float:
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or not 0 <= value <= MAX_SECONDS):
            self.fail(f"{what} must be a number of seconds >= 0 and <= {MAX_SECONDS:g}")
        return float(value)

    def port(self, value: object, what: str) -> int:
        try:
            return parse_port("" if isinstance(value, bool) else str(value))
        except ValueError as exc:
            self.fail(f"{what}: {exc}")

    def endpoints(self, value: object, what: str) -> list[Endpoint]:
        items = value if isinstance(value, list) else [value]
        found = []
        for item in items:
            try:
                entry_text = self.string(item, what).strip()
                self.task_total += count_entry(entry_text)
                check_task_total(self.task_total)
                found += [parse_endpoint(entry) for entry in expand_entry(entry_text)]
            except ValueError as exc:
                self.fail(f"{what}: {exc}")
        return found

    def ssh_settings(self, value: object, what: str) -> SshSettings:
        fields = self.mapping(value, what, _SSH_KEYS)
        return SshSettings(
            user=self.string(fields["user"], f"{what}.user") if "user" in fields else None,
            port=self.port(fields["port"], f"{what}.port") if "port" in fields else None,
            identity_file=(self.string(fields["identity_file"], f"{what}.identity_file")
                           if "identity_file" in fields else None),
            proxy_jump=self.string(fields["proxy_jump"], f"{what}.proxy_jump") if "proxy_jump" in fields else None,
        )

    def optional(self, top: dict, key: str, read, *args):
        """read(top[key], key, *args), or None when the key is absent."""
        return read(top[key], key, *args) if key in top else None


def parse_spec(data: object, source: str) -> ClusterSpec:
    """Check a loaded YAML/JSON document and turn it into the ClusterSpec it describes (its `ssh:`
    as the spec's ssh_defaults, which the command line's own fill in)."""
    read = _Reader(source)
    if data is None:
        read.fail("the file is empty")
    top = read.mapping(data, "the spec", None)
    if "ps" in top:
        read.fail("the ps list goes under 'cluster:', as in TF_CONFIG")
    if "worker" in top or "chief" in top or "workers" in top:
        read.fail("chief and worker lists go under 'cluster:', as in TF_CONFIG")
    read.mapping(top, "the spec", _TOP_KEYS)
    trainer_args = top.get("trainer_args", [])
    if not isinstance(trainer_args, list):
        read.fail("trainer_args must be a list")
    return ClusterSpec(
        tasks=_tasks(read, top),
        addresses=_addresses(read, top),
        ssh_defaults=read.optional(top, "ssh", read.ssh_settings) or SshSettings(),
        command=_command(read, top.get("command")),
        trainer_args=tuple(read.string(arg, "trainer_args") for arg in trainer_args),
        env=_env(read, top.get("env", {})),
        workdir=read.optional(top, "workdir", read.string),
        python=read.optional(top, "python", read.string),
        threads_per_task=read.optional(top, "threads_per_task", read.count, 1, MAX_THREADS_PER_TASK),
        gpus_per_task=read.optional(top, "gpus_per_task", read.count, 0, MAX_GPUS_PER_TASK),
        legacy_keras=bool(read.optional(top, "legacy_keras", read.flag)),
        stall_timeout=read.optional(top, "stall_timeout", read.seconds),
        tensorboard=read.optional(top, "tensorboard", read.string),
        sync=read.optional(top, "sync", read.string),
        setup=read.optional(top, "setup", read.string),
        setup_timeout=read.optional(top, "setup_timeout", read.seconds),
        spares=_spares(read, top.get("spares", [])),
        health_check=read.optional(top, "health_check", read.string),
        health_check_timeout=read.optional(top, "health_check_timeout", _timeout(read)),
        quarantine=read.optional(top, "quarantine", _duration(read)),
        exit_codes=_exit_codes(read, top.get("exit_codes", {})),
        min_hosts=read.optional(top, "min_hosts", read.count, 1, MAX_MIN_HOSTS),
    )


def _timeout(read: _Reader):
    """A number of seconds above 0 (a check that may take no time at all would always fail)."""
    def seconds(value: object, what: str) -> float:
        if read.seconds(value, what) <= 0:
            read.fail(f"{what} must be a number of seconds > 0 and <= {MAX_SECONDS:g}")
        return float(value)
    return seconds


def _duration(read: _Reader):
    """`quarantine:`, as --quarantine writes it ('24h', '90m', '2d', 0: off) or a number of seconds."""
    def duration(value: object, what: str) -> float:
        if isinstance(value, str):
            try:
                return parse_duration(value)
            except ValueError as e:
                read.fail(f"{what}: {e}")
        return read.seconds(value, what)
    return duration


def _exit_codes(read: _Reader, value: object) -> tuple[ExitRule, ...]:
    """`exit_codes:`, a mapping of exit codes to what they mean (launcher/exit_codes.py)."""
    if not isinstance(value, dict):  # its keys are numbers as YAML reads them: not read.mapping's strings
        read.fail("exit_codes must be a mapping of exit codes to actions, e.g. {3: fail}")
    try:
        return parse_mapping(value)
    except ValueError as e:
        read.fail(f"exit_codes: {e}")


def _spares(read: _Reader, value: object) -> tuple[str, ...]:
    """`spares:`, a list of hosts that take the tasks of a host left out during a run."""
    if not isinstance(value, list):
        read.fail("spares must be a list of hosts")
    hosts = []
    for item in value:
        try:
            hosts.append(parse_host(read.string(item, "spares")))
        except ValueError as e:
            read.fail(f"spares: {e}")
    if len(set(hosts)) != len(hosts):
        read.fail("spares: a host is listed twice")
    return tuple(hosts)


def _tasks(read: _Reader, top: dict) -> tuple[TaskSpec, ...]:
    """The `cluster:`, `evaluator:`, `port:` and `hosts:` keys, as tasks."""
    if "cluster" not in top:
        read.fail("missing 'cluster' (a mapping with 'worker' and optionally 'chief')")
    cluster = read.mapping(top["cluster"], "cluster", None)
    if "evaluator" in cluster:
        read.fail("the evaluator must not be inside 'cluster' (it is not part of the TF cluster): "
                  "move it to a top-level 'evaluator' key")
    read.mapping(cluster, "cluster", {CHIEF, WORKER, PS})
    chiefs = read.endpoints(cluster[CHIEF], "cluster.chief") if CHIEF in cluster else []
    if len(chiefs) > 1:
        read.fail(f"cluster.chief lists {len(chiefs)} hosts; a cluster has at most one chief")
    workers = read.endpoints(cluster.get(WORKER, []), "cluster.worker")
    ps = read.endpoints(cluster[PS], "cluster.ps") if PS in cluster else []
    evaluators = read.endpoints(top["evaluator"], "evaluator") if "evaluator" in top else []
    if len(evaluators) > 1:
        read.fail(f"evaluator lists {len(evaluators)} hosts; there is at most one evaluator")
    host_ssh = {}
    _check_host_keys(read, top)
    for name, settings in read.mapping(top.get("hosts", {}), "hosts", None).items():
        try:
            settings = {k: v for k, v in read.mapping(settings, f"hosts.{name}", _HOST_KEYS).items() if k != "address"}
            for host in expand_entry(name):  # a hostlist key sets every host it names
                host_ssh[parse_host(host)] = read.ssh_settings(settings, f"hosts.{name}")
        except ValueError as exc:
            read.fail(f"hosts: {exc}")
    default_port = read.optional(top, "port", read.port)
    try:
        return build_tasks(chiefs[0] if chiefs else None, workers, evaluators[0] if evaluators else None,
                           default_port, host_ssh, ps=ps)
    except SpecError as exc:
        read.fail(str(exc))


def _check_host_keys(read: _Reader, top: dict) -> None:
    """At most MAX_TASKS hosts named under `hosts:`, counted before any key is expanded."""
    total = 0
    for name in read.mapping(top.get("hosts", {}), "hosts", None):
        try:
            total += count_entry(name)
        except ValueError as exc:
            read.fail(f"hosts: {exc}")
        if total > MAX_TASKS:
            read.fail(f"hosts: names more than {MAX_TASKS} hosts")


def _addresses(read: _Reader, top: dict) -> dict[str, str]:
    """`hosts.H.address`: the address the other tasks reach host H at."""
    found = {}
    for name, settings in read.mapping(top.get("hosts", {}), "hosts", None).items():
        if isinstance(settings, dict) and "address" in settings:
            try:
                address = parse_host(read.string(settings["address"], f"hosts.{name}.address"))
                for host in expand_entry(name):
                    found[parse_host(host)] = address
            except ValueError as exc:
                read.fail(f"hosts.{name}.address: {exc}")
    return found


def _command(read: _Reader, command: object) -> tuple[str, ...] | None:
    if command is None:
        return None
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError as exc:
            read.fail(f"command: {exc}")
    elif not isinstance(command, list):
        read.fail("command must be a list of arguments or a string")
    parts = tuple(read.string(part, "command") for part in command)
    if not parts:
        read.fail("command is empty")
    return parts


def _env(read: _Reader, value: object) -> dict[str, str]:
    env = {}
    for name, item in read.mapping(value, "env", None).items():
        if isinstance(item, float):  # YAML reads 1e3, 0.10 and .nan as numbers: their text is lost
            read.fail(f"env.{name} is a YAML number ({item!r}); put it in quotes to pass it as written")
        try:
            env[parse_env_name(name)] = read.string(item, f"env.{name}")
        except ValueError as exc:
            read.fail(f"env: {exc}")
    return env


# The document as written out in full: an alias counts every time it is used, so that a few lines
# of nested aliases (a "billion laughs") cannot expand into gigabytes in any field.
MAX_NODES = 1_000_000
MAX_DEPTH = 64


def load_spec_text(text: str, source: str) -> ClusterSpec:
    """Parse YAML or JSON (JSON is YAML) text, with alias expansion and nesting bounded and
    duplicate keys refused."""
    import yaml  # only spec files need it; it is a third of the CLI's import time

    if _bracket_depth(text) > _MAX_BRACKETS:  # PyYAML's scanner slows down with the square of the depth
        raise SpecError(f"{source}: nested too deeply (at most {MAX_DEPTH} levels)")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_document(node, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML or JSON"
        raise SpecError(f"{source}: {problem}{at}") from None
    except RecursionError:
        raise SpecError(f"{source}: nested too deeply (at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()
    return parse_spec(data, source)


_MAX_BRACKETS = 1000  # far above MAX_DEPTH, so that brackets inside plain text never trip it


def _bracket_depth(text: str) -> int:
    """The deepest nesting of [ and { outside quotes: a cheap bound checked before parsing."""
    depth = deepest = 0
    for part in re.split(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'", text):
        for char in re.findall(r"[\[\]{}]", part):
            depth = depth + 1 if char in "[{" else max(depth - 1, 0)
            deepest = max(deepest, depth)
    return deepest


def _check_document(root, source: str) -> None:
    """Refuse a document whose full expansion exceeds MAX_NODES or MAX_DEPTH, or that repeats a
    key in a mapping. Each node is visited once: aliases are shared nodes, sized once."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[object, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if depth[key] > MAX_DEPTH:
                raise SpecError(f"{source}: nested too deeply (at most {MAX_DEPTH} levels)")
            if size[key] > MAX_NODES:
                raise SpecError(f"{source}: the document is too large once its aliases are expanded "
                                f"(at most {MAX_NODES} values)")
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise SpecError(f"{source}: an alias refers to a value that contains it, at line {node.start_mark.line + 1}")
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            _check_duplicate_keys(node, source)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in size)


def _children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_duplicate_keys(node, source: str) -> None:
    import yaml

    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            if (key.tag, key.value) in seen:
                raise SpecError(f"{source}: key {key.value!r} appears twice in one mapping, at line "
                                f"{key.start_mark.line + 1}")
            seen.add((key.tag, key.value))
