"""Where an SSH host really is: spec settings over ~/.ssh/config over defaults, as OpenSSH does."""

from __future__ import annotations

import dataclasses
import getpass
import os

import paramiko

from launcher.config.addresses import Endpoint, parse_endpoint, parse_host, parse_port
from launcher.config.spec import SshSettings
from launcher.errors import ConnectError, UsageError
from launcher.host.files import read_input_file
from launcher.backends.ssh import hostkeys


@dataclasses.dataclass(frozen=True)
class SshTarget:
    """A host as OpenSSH would reach it: spec settings over ssh config over defaults."""

    alias: str  # the name in the spec
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: tuple[Endpoint, ...]  # jump hosts, outermost first
    proxy_command: str | None = None  # ssh config's ProxyCommand (%h, %p expanded); ProxyJump wins

    @property
    def label(self) -> str:
        name = hostkeys.known_hosts_name(self.hostname, self.port)
        return name if self.alias == self.hostname else f"{self.alias} ({name})"


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    """--ssh-config, or ~/.ssh/config when it exists. Raises ConnectError for a missing
    --ssh-config, and UsageError for a file that is not a regular UTF-8 file of at most
    MAX_INPUT_BYTES, or that paramiko cannot parse."""
    option = "--ssh-config" if path else "ssh config"
    path = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.lexists(path):
        if option != "ssh config":  # the CLI refuses it first; a backend made from Python gets this
            raise ConnectError(f"ssh config file not found: {path}")
        return paramiko.SSHConfig()
    data = read_input_file(path, option)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path}: not a text file (not UTF-8)") from None
    try:
        return paramiko.SSHConfig.from_text(text)
    except Exception as e:  # paramiko raises assorted errors for bad files
        raise UsageError(f"{option} {path}: {str(e) or type(e).__name__}") from None


def hostname_addresses(hosts: list[str], config_path: str | None) -> dict[str, str]:
    """host -> the HostName the ssh config gives it, for the hosts where that differs."""
    config = load_ssh_config(config_path)
    found = {host: config_hostname(host, config.lookup(host)) for host in hosts}
    return {host: hostname for host, hostname in found.items() if hostname != host}


def config_hostname(alias: str, found: dict) -> str:
    """The ssh config's HostName for `alias` (the alias itself when none), checked as a host name
    or address: it goes into TF_CONFIG and onto the SSH connection as written."""
    hostname = found.get("hostname", alias)
    try:
        return parse_host(hostname)
    except ValueError as exc:
        raise UsageError(f"{alias}: ssh config: HostName {exc}") from None


def resolve_target(alias: str, settings: SshSettings | None, config: paramiko.SSHConfig) -> SshTarget:
    """Raises UsageError for a ProxyJump that is not `[user@]host[:port],...`, and ConnectError
    for an identity file given in the spec or on the command line that does not exist."""
    settings = settings or SshSettings()
    found = config.lookup(alias)
    port = settings.port if settings.port is not None else _config_port(alias, found.get("port", "22"))
    user = settings.user or found.get("user") or getpass.getuser()
    if settings.identity_file:
        identity = os.path.expanduser(settings.identity_file)
        if not os.path.isfile(identity):
            raise ConnectError(f"{alias}: identity file {identity} not found")
        identities: tuple[str, ...] = (identity,)
    else:
        # Like ssh, skip IdentityFile entries that do not exist (config files often list several).
        identities = tuple(
            path for path in (os.path.expanduser(p) for p in found.get("identityfile", [])) if os.path.isfile(path)
        )
    jump = settings.proxy_jump if settings.proxy_jump is not None else found.get("proxyjump")
    jumps = []
    if jump and jump.lower() != "none":
        for hop in (j.strip() for j in jump.split(",")):
            try:
                jumps.append(parse_endpoint(hop))
            except ValueError as e:  # e names the hop; name the whole list when there are several
                shown = f"{jump!r}: {e}" if "," in jump else str(e)
                raise UsageError(f"{alias}: bad ProxyJump {shown}") from None
    proxy_command = found.get("proxycommand")
    if jumps or not proxy_command or proxy_command.lower() == "none":
        proxy_command = None
    return SshTarget(alias, config_hostname(alias, found), port, user, identities, tuple(jumps), proxy_command)



def _config_port(alias: str, text: str) -> int:
    try:
        return parse_port(text)
    except ValueError as e:
        raise UsageError(f"{alias}: ssh config: Port {text}: {e}") from None
