"""The cluster spec: which tasks run where, and how to reach their hosts."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Iterable, Mapping, NoReturn, Sequence


from launcher.errors import SpecError
from launcher.protocol import TASK_TYPES
from launcher.params import (
    Endpoint, format_address, parse_endpoint, parse_env_assignment, parse_env_name, parse_host, parse_port,
)

CHIEF = "chief"
WORKER = "worker"
EVALUATOR = "evaluator"
ROLES = TASK_TYPES  # also the order tasks are planned and shown in


@dataclasses.dataclass(frozen=True)
class SshSettings:
    """How to log into one host. None means: ask ~/.ssh/config, then the defaults."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None

    def merged_over(self, defaults: "SshSettings") -> "SshSettings":
        """These settings, with gaps filled from `defaults`."""
        return SshSettings(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(defaults, f.name)
                for f in dataclasses.fields(self)
            }
        )


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task: its role and where it runs. An evaluator has no port (it is not in the cluster)."""

    role: str
    host: str
    port: int | None
    ssh: SshSettings = SshSettings()


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    tasks: tuple[TaskSpec, ...]
    # The program each task runs; None means the built-in trainer.
    command: tuple[str, ...] | None = None
    # Arguments for the built-in trainer (only when command is None).
    trainer_args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    # SSH settings for hosts whose own settings leave a gap.
    ssh_defaults: SshSettings = SshSettings()
    # The interpreter that runs the built-in trainer; None means the launcher's own (local tasks)
    # or "python3" (remote tasks).
    python: str | None = None
    threads_per_task: int | None = None
    gpus_per_task: int | None = None


# ---------------------------------------------------------------------------
# Building task lists from what the user wrote, and checking them.

PS_MESSAGE = (
    "the 'ps' role is for parameter-server training; MultiWorkerMirroredStrategy uses collective "
    "all-reduce and has no parameter servers: list those hosts as workers"
)


def build_tasks(
    chief: Endpoint | None,
    workers: Sequence[Endpoint],
    evaluator: Endpoint | None,
    default_port: int | None,
    host_ssh: Mapping[str, SshSettings] | None = None,
) -> tuple[TaskSpec, ...]:
    """Tasks in planning order (chief, workers, evaluator), checked for consistency.

    A `user@` in an entry and `host_ssh[host]` set that host's SSH settings.
    """
    host_ssh = host_ssh or {}

    def task(role: str, endpoint: Endpoint) -> TaskSpec:
        ssh = host_ssh.get(endpoint.host, SshSettings())
        if endpoint.user:
            ssh = dataclasses.replace(ssh, user=endpoint.user)
        if role == EVALUATOR:
            if endpoint.port is not None:
                raise SpecError(
                    f"evaluator {endpoint}: the evaluator is not part of the cluster and takes no port"
                )
            return TaskSpec(role, endpoint.host, None, ssh)
        port = endpoint.port if endpoint.port is not None else default_port
        if port is None:
            raise SpecError(f"{role} {endpoint} has no port: write {endpoint}:PORT or give --port")
        return TaskSpec(role, endpoint.host, port, ssh)

    tasks = [task(CHIEF, chief)] if chief else []
    tasks += [task(WORKER, endpoint) for endpoint in workers]
    if not tasks:
        raise SpecError("the cluster is empty: give at least one worker")
    if evaluator:
        tasks.append(task(EVALUATOR, evaluator))
    _reject_duplicates(tasks)
    return tuple(tasks)


def _reject_duplicates(tasks: Sequence[TaskSpec]) -> None:
    seen: dict[tuple[str, int], str] = {}
    counts = {role: 0 for role in ROLES}
    for task in tasks:
        name = f"{task.role}:{counts[task.role]}"
        counts[task.role] += 1
        if task.port is None:
            continue
        key = (task.host, task.port)
        if key in seen:
            raise SpecError(f"{format_address(*key)} is listed twice ({seen[key]} and {name})")
        seen[key] = name


def local_tasks(ports: Sequence[int], with_chief: bool, with_evaluator: bool) -> tuple[TaskSpec, ...]:
    """A cluster simulated on this machine: a chief (if asked) and workers on `ports`, on 127.0.0.1."""
    endpoints = [Endpoint("127.0.0.1", port) for port in ports]
    return build_tasks(endpoints[0] if with_chief else None, endpoints[with_chief:],
                       Endpoint("127.0.0.1") if with_evaluator else None, None)


def expand_slots(entries: Iterable[tuple[Endpoint, int]], default_port: int | None) -> tuple[Endpoint, ...]:
    """One endpoint per slot: `host slots=3` on port P becomes ports P, P+1, P+2."""
    endpoints = []
    for endpoint, slots in entries:
        port = endpoint.port if endpoint.port is not None else default_port
        if port is None:
            raise SpecError(f"{endpoint} has no port: write {endpoint}:PORT or give --port")
        if port + slots - 1 > 65535:
            raise SpecError(f"{endpoint} with slots={slots} runs past port 65535")
        endpoints += [dataclasses.replace(endpoint, port=port + i) for i in range(slots)]
    return tuple(endpoints)


# ---------------------------------------------------------------------------
# Hostfiles: `host[:port]` per line, or the `host slots=N` form of Horovod, DeepSpeed and MPI.


def parse_hostfile(text: str, source: str) -> tuple[tuple[Endpoint, int], ...]:
    """(endpoint, slots) per line. `source` names the file in messages."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        first, *options = line.split()
        try:
            endpoint = parse_endpoint(first)
        except ValueError as exc:
            raise SpecError(f"{where}: {exc}") from None
        slots = 1
        for option in options:
            key, sep, value = option.partition("=")
            if key not in ("slots", "max_slots") or not sep:
                raise SpecError(f"{where}: unknown setting {option!r} (expected slots=N)")
            if not value.isdigit() or int(value) < 1:
                raise SpecError(f"{where}: {key} must be a positive number, not {value!r}")
            if key == "slots":  # max_slots is an MPI oversubscription limit; one task per slot ignores it
                slots = int(value)
        entries.append((endpoint, slots))
    if not entries:
        raise SpecError(f"{source}: no hosts in the hostfile")
    return tuple(entries)


# ---------------------------------------------------------------------------
# Spec files (YAML or JSON). The schema is documented in the README.


@dataclasses.dataclass(frozen=True)
class SpecFile:
    """What a spec file says. The CLI combines it with its own options into a ClusterSpec."""

    tasks: tuple[TaskSpec, ...]
    ssh: SshSettings = SshSettings()
    command: tuple[str, ...] | None = None
    trainer_args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    python: str | None = None
    threads_per_task: int | None = None
    gpus_per_task: int | None = None

    def cluster_spec(self, ssh_defaults: SshSettings) -> ClusterSpec:
        """The ClusterSpec this file describes; `ssh_defaults` (from the command line) win over its `ssh:`."""
        return ClusterSpec(
            tasks=self.tasks,
            command=self.command,
            trainer_args=self.trainer_args,
            env=self.env,
            workdir=self.workdir,
            ssh_defaults=ssh_defaults.merged_over(self.ssh),
            python=self.python,
            threads_per_task=self.threads_per_task,
            gpus_per_task=self.gpus_per_task,
        )


_TOP_KEYS = {
    "cluster", "evaluator", "port", "ssh", "hosts", "command", "trainer_args", "env", "workdir",
    "python", "threads_per_task", "gpus_per_task",
}
_SSH_KEYS = {"user", "port", "identity_file", "proxy_jump"}


def parse_spec(data: object, source: str) -> SpecFile:
    """Check a loaded YAML/JSON document and turn it into a SpecFile."""
    where = source

    def fail(message: str) -> NoReturn:
        raise SpecError(f"{where}: {message}")

    def mapping(value: object, what: str, allowed: set[str] | None = None) -> dict:
        if not isinstance(value, dict):
            fail(f"{what} must be a mapping")
        for key in value:
            if not isinstance(key, str):
                fail(f"{what}: key {key!r} is not a string")
            if allowed is not None and key not in allowed:
                fail(f"unknown key {key!r} in {what} (known keys: {', '.join(sorted(allowed))})")
        return value

    def string(value: object, what: str) -> str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            fail(f"{what} must be a string")
        return str(value)

    def count(value: object, what: str, minimum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            fail(f"{what} must be a whole number >= {minimum}")
        return value

    def port(value: object, what: str) -> int:
        try:
            return parse_port("" if isinstance(value, bool) else str(value))
        except ValueError as exc:
            fail(f"{what}: {exc}")

    def endpoint(value: object, what: str) -> Endpoint:
        try:
            return parse_endpoint(string(value, what))
        except ValueError as exc:
            fail(f"{what}: {exc}")

    def endpoints(value: object, what: str) -> list[Endpoint]:
        items = value if isinstance(value, list) else [value]
        return [endpoint(item, what) for item in items]

    def ssh_settings(value: object, what: str) -> SshSettings:
        fields = mapping(value, what, _SSH_KEYS)
        return SshSettings(
            user=string(fields["user"], f"{what}.user") if "user" in fields else None,
            port=port(fields["port"], f"{what}.port") if "port" in fields else None,
            identity_file=string(fields["identity_file"], f"{what}.identity_file") if "identity_file" in fields else None,
            proxy_jump=string(fields["proxy_jump"], f"{what}.proxy_jump") if "proxy_jump" in fields else None,
        )

    if data is None:
        fail("the file is empty")
    top = mapping(data, "the spec", None)
    if "ps" in top:
        fail(PS_MESSAGE)
    if "worker" in top or "chief" in top or "workers" in top:
        fail("chief and worker lists go under 'cluster:', as in TF_CONFIG")
    mapping(top, "the spec", _TOP_KEYS)
    if "cluster" not in top:
        fail("missing 'cluster' (a mapping with 'worker' and optionally 'chief')")
    cluster = mapping(top["cluster"], "cluster", None)
    if "ps" in cluster:
        fail(f"cluster.ps: {PS_MESSAGE}")
    if "evaluator" in cluster:
        fail("the evaluator must not be inside 'cluster' (it is not part of the TF cluster): "
             "move it to a top-level 'evaluator' key")
    mapping(cluster, "cluster", {CHIEF, WORKER})
    chiefs = endpoints(cluster[CHIEF], "cluster.chief") if CHIEF in cluster else []
    if len(chiefs) > 1:
        fail(f"cluster.chief lists {len(chiefs)} hosts; a cluster has at most one chief")
    workers = endpoints(cluster.get(WORKER, []), "cluster.worker")
    evaluators = endpoints(top["evaluator"], "evaluator") if "evaluator" in top else []
    if len(evaluators) > 1:
        fail(f"evaluator lists {len(evaluators)} hosts; there is at most one evaluator")

    hosts = mapping(top.get("hosts", {}), "hosts", None)
    host_ssh = {}
    for name, settings in hosts.items():
        try:
            host_ssh[parse_host(name)] = ssh_settings(settings, f"hosts.{name}")
        except ValueError as exc:
            fail(f"hosts: {exc}")

    command = top.get("command")
    if command is not None:
        if isinstance(command, str):
            try:
                command = shlex.split(command)
            except ValueError as exc:
                fail(f"command: {exc}")
        elif not isinstance(command, list):
            fail("command must be a list of arguments or a string")
        command = tuple(string(part, "command") for part in command)
        if not command:
            fail("command is empty")
    trainer_args = top.get("trainer_args", [])
    if not isinstance(trainer_args, list):
        fail("trainer_args must be a list")
    env = {}
    for name, value in mapping(top.get("env", {}), "env", None).items():
        try:
            env[parse_env_name(name)] = string(value, f"env.{name}")
        except ValueError as exc:
            fail(f"env: {exc}")

    default_port = port(top["port"], "port") if "port" in top else None
    try:
        tasks = build_tasks(
            chiefs[0] if chiefs else None,
            workers,
            evaluators[0] if evaluators else None,
            default_port,
            host_ssh,
        )
    except SpecError as exc:
        fail(str(exc))
    return SpecFile(
        tasks=tasks,
        ssh=ssh_settings(top["ssh"], "ssh") if "ssh" in top else SshSettings(),
        command=command,
        trainer_args=tuple(string(arg, "trainer_args") for arg in trainer_args),
        env=env,
        workdir=string(top["workdir"], "workdir") if "workdir" in top else None,
        python=string(top["python"], "python") if "python" in top else None,
        threads_per_task=count(top["threads_per_task"], "threads_per_task", 1) if "threads_per_task" in top else None,
        gpus_per_task=count(top["gpus_per_task"], "gpus_per_task", 0) if "gpus_per_task" in top else None,
    )


def load_spec_text(text: str, source: str) -> SpecFile:
    """Parse YAML or JSON (JSON is YAML) text."""
    import yaml  # only spec files need it; it is a third of the CLI's import time

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML or JSON"
        raise SpecError(f"{source}: {problem}{at}") from None
    return parse_spec(data, source)


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
