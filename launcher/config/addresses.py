"""Parsing of host addresses and other option values.

The parse_* functions are pure and raise ValueError with a message that names
the problem; the CLI's ParamTypes (launcher.cli.params) wrap them so bad input
is refused at parse time. Standard library only: no DNS, no environment.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re

from launcher.config.hostlist import check_task_total, count_entry, expand_entry, split_top_level
from launcher.protocol import TASK_TYPES

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A host as written by the user: `[user@]host[:port]`. port None means "use the default"."""

    host: str
    port: int | None = None
    user: str | None = None

    def __str__(self) -> str:
        return (f"{self.user}@" if self.user else "") + format_address(self.host, self.port)


def format_address(host: str, port: int | None) -> str:
    """host:port, with IPv6 addresses in brackets as TF_CONFIG and gRPC expect."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def parse_port(text: str) -> int:
    if not is_number(text):
        raise ValueError(f"port {text!r} is not a number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range (1-65535)")
    return port


def parse_host_list(text: str) -> tuple[str, ...]:
    """Comma-separated host names or addresses, each once."""
    hosts = tuple(parse_host(part.strip()) for part in text.split(","))
    if len(set(hosts)) != len(hosts):
        raise ValueError("a host is listed twice")
    return hosts


def parse_host(text: str) -> str:
    """A hostname, an IPv4 address or a bare IPv6 address (without brackets)."""
    if not text:
        raise ValueError("empty host name")
    if ":" in text:
        try:
            return str(ipaddress.IPv6Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a valid IPv6 address") from None
    if re.fullmatch(r"[0-9.]+", text):
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise ValueError(f"{text!r} is not a valid IPv4 address") from None
    if not _HOSTNAME.fullmatch(text):
        raise ValueError(f"{text!r} is not a valid host name")
    return text


def parse_endpoint(text: str) -> Endpoint:
    """Parse `[user@]host[:port]`, where host may be `[IPv6]`."""
    entry = text.strip()
    if not entry:
        raise ValueError("empty host entry")
    user = None
    if "@" in entry:
        user, _, entry = entry.rpartition("@")
        if not _USER.fullmatch(user):
            raise ValueError(f"{text!r}: {user!r} is not a valid user name")
    port_text = None
    if entry.startswith("["):
        host_text, sep, rest = entry[1:].partition("]")
        if not sep:
            raise ValueError(f"{text!r}: missing ']' after the IPv6 address")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{text!r}: expected ':PORT' after ']'")
            port_text = rest[1:]
        if ":" not in host_text:
            raise ValueError(f"{text!r}: brackets are only for IPv6 addresses")
    elif entry.count(":") > 1:
        raise ValueError(f"{text!r}: write IPv6 addresses in brackets, as [{entry}]:PORT")
    else:
        host_text, sep, port_text = entry.partition(":")
        if not sep:
            port_text = None
    try:
        host = parse_host(host_text)
        port = parse_port(port_text) if port_text is not None else None
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    return Endpoint(host, port, user)


def parse_endpoint_list(text: str) -> tuple[Endpoint, ...]:
    """A comma-separated host list, as in `h1:2222,h2:2222`; Slurm hostlist ranges such as
    `node[01-04]:2222` expand in place."""
    if not text.strip():
        raise ValueError("the host list is empty")
    parts = split_top_level(text)
    if any(not part.strip() for part in parts):
        raise ValueError(f"{text!r} has an empty entry")
    check_task_total(sum(count_entry(part.strip()) for part in parts))
    return tuple(parse_endpoint(entry) for part in parts for entry in expand_entry(part.strip()))


def parse_worker_list(text: str) -> tuple[Endpoint, ...]:
    """`--workers`: a host list in which a port below 1024 is refused, since `host:4` is how
    Horovod's `-H` writes 4 slots, not a port."""
    endpoints = parse_endpoint_list(text)
    for endpoint in endpoints:
        if endpoint.port is not None and endpoint.port < PRIVILEGED_PORTS:
            raise ValueError(
                f"{endpoint}: port {endpoint.port} is below {PRIVILEGED_PORTS}; if {endpoint.port} is a number of "
                f"slots (Horovod's -H host:slots), write --hosts {endpoint.host}:{endpoint.port}, or "
                f"'{endpoint.host} slots={endpoint.port}' in a --hostfile"
            )
    return endpoints


PRIVILEGED_PORTS = 1024


def parse_slots_list(text: str) -> tuple[tuple[Endpoint, int], ...]:
    """Horovod's `-H host:slots,...` (hosts may be hostlists): (endpoint without port, slots) per host."""
    if not text.strip():
        raise ValueError("the host list is empty")
    entries = []
    total = 0
    for part in split_top_level(text):
        if not part.strip():
            raise ValueError(f"{text!r} has an empty entry")
        part = part.strip()
        split = re.fullmatch(r"(.*[^:]):([^:\]]*)", part)  # the last colon outside [IPv6]
        slots_text = split.group(2) if split else "1"
        if is_number(slots_text):
            total += count_entry(part) * int(slots_text)
            check_task_total(total)  # before anything is expanded
        for entry in expand_entry(part):
            split = re.fullmatch(r"(.*[^:]):([^:\]]*)", entry)
            host_text, slots_text = split.groups() if split else (entry, "1")
            if not is_number(slots_text) or int(slots_text) < 1:
                raise ValueError(f"{entry!r}: slots must be a positive number, not {slots_text!r}")
            endpoint = parse_endpoint(host_text)
            if endpoint.port is not None:
                raise ValueError(f"{entry!r}: --hosts takes host:slots; ports come from --port")
            entries.append((endpoint, int(slots_text)))
    return tuple(entries)


def parse_env_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r} is not NAME=VALUE")
    return parse_env_name(name), value


def parse_env_name(text: str) -> str:
    if not _ENV_NAME.fullmatch(text):
        raise ValueError(f"{text!r} is not a valid environment variable name")
    return text


_RUN_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def parse_run_id(text: str) -> str:
    """A run id names a folder and tags every process of the run: letters, digits, '.', '_', '-'."""
    if not _RUN_ID.fullmatch(text):
        raise ValueError(f"{text!r} is not a valid run id (letters, digits, '.', '_' and '-', at most 128)")
    return text


def parse_task_selector(text: str) -> str:
    """`worker` (every worker) or `worker:1` (one task)."""
    task_type, sep, index = text.partition(":")
    if task_type not in TASK_TYPES:
        raise ValueError(f"{text!r}: task type must be one of {', '.join(TASK_TYPES)}")
    if sep and not is_number(index):
        raise ValueError(f"{text!r}: task index must be a number")
    return f"{task_type}:{int(index)}" if sep else task_type
