"""Tasks on other machines, started over SSH with paramiko.

This is the only module that imports paramiko. Settings for a host come from
the spec (plan.ssh, CLI flags merged in) first, then the ssh config file, then
defaults, like OpenSSH. Host keys are checked against ~/.ssh/known_hosts plus
an optional extra file; unknown keys are refused unless accepting new ones was
asked for, changed keys always. Tasks on one host share a connection.

How a remote task is wrapped, and why nothing outlives its SSH session, is
explained in runners/remote_command.py.
"""

from __future__ import annotations

import dataclasses
import getpass
import io
import os
import signal
import socket
import threading
import time
import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

from launcher import hostkeys
from launcher.errors import ConnectError, HostKeyError, MgpuError
from launcher.plan import TaskPlan
from launcher.protocol import ENV_ATTEMPT
from launcher.runners import remote_command
from launcher.runners.base import Runner, TaskProcess
from launcher.runners.ssh_options import SshOptions
from launcher.spec import SshSettings

# Sessions opened on one connection before another is opened; sshd's MaxSessions defaults to 10.
_SESSIONS_PER_CONNECTION = 8
# Exit code reported when the connection died before the task's status arrived (as ssh(1) does).
EXIT_CONNECTION_LOST = 255
# Unanswered keepalives before a connection counts as dead (ssh's ServerAliveCountMax).
_KEEPALIVE_COUNT_MAX = 3
# Channel window: large enough that a chatty task never waits for us between reads.
_WINDOW_SIZE = 8 * 1024 * 1024

_known_hosts_lock = threading.Lock()


# ---------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A host as OpenSSH would reach it: spec settings over ssh config over defaults."""

    alias: str  # the name in the spec
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: tuple[str, ...]  # jump hosts, outermost first, each "[user@]host[:port]"

    @property
    def label(self) -> str:
        name = hostkeys.known_hosts_name(self.hostname, self.port)
        return name if self.alias == self.hostname else f"{self.alias} ({name})"


def _load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    path = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.exists(path):
        if path != os.path.expanduser("~/.ssh/config"):
            raise ConnectError(f"ssh config file not found: {path}")
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(path)
    except Exception as e:  # paramiko raises assorted errors for bad files
        raise ConnectError(f"cannot read ssh config {path}: {e}") from e


def _split_jump(jump: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` -> (user, host, port)."""
    user = None
    if "@" in jump:
        user, jump = jump.rsplit("@", 1)
    port = None
    if jump.startswith("["):  # [v6addr]:port
        host, _, rest = jump[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif jump.count(":") == 1:
        host, port_text = jump.split(":")
        port = int(port_text)
    else:
        host = jump
    return user, host, port


def resolve_endpoint(alias: str, settings: SshSettings | None, config: paramiko.SSHConfig) -> Endpoint:
    settings = settings or SshSettings()
    found = config.lookup(alias)
    port = settings.port if settings.port is not None else int(found.get("port", 22))
    user = settings.user or found.get("user") or getpass.getuser()
    if settings.identity_file:
        identities = (os.path.expanduser(settings.identity_file),)
    else:
        identities = tuple(os.path.expanduser(p) for p in found.get("identityfile", []))
    jump = settings.proxy_jump if settings.proxy_jump is not None else found.get("proxyjump")
    jumps = () if not jump or jump.lower() == "none" else tuple(j.strip() for j in jump.split(",") if j.strip())
    return Endpoint(alias, found.get("hostname", alias), port, user, identities, jumps)


# ---------------------------------------------------------------- host keys


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or record them (StrictHostKeyChecking=accept-new)."""

    def __init__(self, accept_new: bool, record_in: str):
        self.accept_new = accept_new
        self.record_in = record_in

    def missing_host_key(self, client, hostname, key):
        host, port = _split_known_hosts_name(hostname)
        fingerprint = hostkeys.sha256_fingerprint(key.asbytes())
        if not self.accept_new:
            raise HostKeyError(
                hostkeys.unknown_key_message(host, port, key.get_name(), fingerprint, self.record_in)
            )
        with _known_hosts_lock:
            directory = os.path.dirname(self.record_in)
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, mode=0o700, exist_ok=True)
            with open(self.record_in, "a", encoding="utf-8") as f:
                f.write(hostkeys.known_hosts_line(host, port, key.get_name(), key.get_base64()))
        client.get_host_keys().add(hostname, key.get_name(), key)


def _split_known_hosts_name(name: str) -> tuple[str, int]:
    if name.startswith("[") and "]:" in name:
        host, port = name[1:].rsplit("]:", 1)
        return host, int(port)
    return name, 22


# ---------------------------------------------------------------- connections


class _Transport(paramiko.Transport):
    """A Transport that also records the SSH "exit-signal" request paramiko ignores,
    so a remote task killed by signal N reports -N like a local one."""

    def _handle_channel_request(chan, m):  # noqa: N805 - called as table[ptype](chan, m)
        start = m.packet.tell()
        try:
            if m.get_text() == "exit-signal":
                m.get_boolean()  # want_reply
                name = m.get_text()
                try:
                    chan.mgpu_exit_signal = int(signal.Signals["SIG" + name])
                except KeyError:  # a signal this system has no name for
                    chan.mgpu_exit_signal = int(signal.SIGKILL)
        except Exception:
            pass
        m.packet.seek(start)
        paramiko.Channel._handle_request(chan, m)

    _channel_handler_table = {
        **paramiko.Transport._channel_handler_table,
        MSG_CHANNEL_REQUEST: _handle_channel_request,
    }


def _describe_os_error(e: BaseException) -> str:
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {err.strerror or str(err) for err in e.errors.values()}
        return "; ".join(sorted(reasons))
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve name ({e.strerror})"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


class _Connection:
    """One authenticated SSH connection, with a keepalive watch that closes it when the peer is gone."""

    def __init__(self, endpoint: Endpoint, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient], keepalive: float):
        self.endpoint = endpoint
        self.client = client
        self.jumps = jumps  # jump host connections this one tunnels through
        self.sessions = 0
        self.lock = threading.Lock()
        self.transport = client.get_transport()
        self._closed = threading.Event()
        if keepalive > 0:
            threading.Thread(target=self._watch, args=(keepalive,), daemon=True, name=f"ssh-keepalive {endpoint.alias}").start()

    def _watch(self, interval: float) -> None:
        while not self._closed.wait(interval):
            if not self.transport.is_active():
                return
            answered = threading.Event()

            def ping():
                try:
                    # OpenSSH answers unknown global requests with a failure: any answer proves it is alive.
                    self.transport.global_request("keepalive@openssh.com", wait=True)
                finally:
                    answered.set()

            threading.Thread(target=ping, daemon=True).start()
            if not answered.wait(interval * _KEEPALIVE_COUNT_MAX):
                self.transport.close()
                return

    @property
    def active(self) -> bool:
        return self.transport is not None and self.transport.is_active()

    def open_session(self, timeout: float) -> paramiko.Channel:
        try:
            return self.transport.open_session(window_size=_WINDOW_SIZE, timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectError(f"{self.endpoint.label}: cannot open an SSH session: {e}") from e

    def run(self, command: str, timeout: float) -> tuple[int, bytes, bytes]:
        """Run a command to completion; (exit code, stdout, stderr). Raises ConnectError on timeout."""
        chan = self.open_session(timeout)
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while not (chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready() and chan.eof_received):
                if time.monotonic() > deadline:
                    raise ConnectError(f"{self.endpoint.label}: command did not finish within {timeout:g} s")
                got = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not got:
                    time.sleep(0.02)
            status = chan.exit_status if chan.exit_status_ready() else EXIT_CONNECTION_LOST
            return status, bytes(out), bytes(err)
        except socket.timeout as e:
            raise ConnectError(f"{self.endpoint.label}: command did not finish within {timeout:g} s") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise ConnectError(f"{self.endpoint.label}: {e or type(e).__name__}") from e
        finally:
            chan.close()

    def close(self) -> None:
        self._closed.set()
        self.client.close()
        for jump in reversed(self.jumps):
            jump.close()


def _connect(endpoint: Endpoint, options: SshOptions, config: paramiko.SSHConfig) -> _Connection:
    """Connect and log in, through the endpoint's jump hosts if any. Raises ConnectError/HostKeyError."""
    hops = []
    for jump in endpoint.proxy_jump:
        user, host, port = _split_jump(jump)
        hops.append(resolve_endpoint(host, SshSettings(user=user, port=port), config))
    clients: list[paramiko.SSHClient] = []
    try:
        sock = None
        for hop, following in zip(hops, hops[1:] + [endpoint]):
            clients.append(_login(hop, options, sock))
            try:
                # The next hop is reached through a direct-tcpip channel of this one, like ssh -J.
                sock = clients[-1].get_transport().open_channel(
                    "direct-tcpip", (following.hostname, following.port), ("127.0.0.1", 0), timeout=options.connect_timeout
                )
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise ConnectError(
                    f"{endpoint.label}: jump host {hop.label} cannot reach {following.hostname}:{following.port}: {e}"
                ) from e
        client = _login(endpoint, options, sock, via=endpoint.proxy_jump)
    except BaseException:
        for jump in reversed(clients):
            jump.close()
        raise
    return _Connection(endpoint, client, clients, options.keepalive)


def _login(endpoint: Endpoint, options: SshOptions, sock, via: tuple[str, ...] = ()) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    record_in = hostkeys.default_known_hosts()
    if options.known_hosts:
        record_in = os.path.expanduser(options.known_hosts)
        if os.path.exists(record_in):
            client.load_host_keys(record_in)
    client.set_missing_host_key_policy(_HostKeyPolicy(options.accept_new_host_keys, record_in))
    where = endpoint.label + (f" via {','.join(via)}" if via else "")
    try:
        client.connect(
            endpoint.hostname,
            port=endpoint.port,
            username=endpoint.user,
            key_filename=list(endpoint.identity_files) or None,
            timeout=options.connect_timeout,
            banner_timeout=options.connect_timeout,
            auth_timeout=options.connect_timeout,
            channel_timeout=options.connect_timeout,
            allow_agent=True,
            look_for_keys=True,
            sock=sock,
            transport_factory=_Transport,
        )
    except MgpuError:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostKeyError(
            hostkeys.changed_key_message(
                endpoint.hostname, endpoint.port, e.key.get_name(), hostkeys.sha256_fingerprint(e.key.asbytes())
            )
        ) from e
    except paramiko.AuthenticationException as e:
        client.close()
        tried = "ssh-agent, " + (", ".join(endpoint.identity_files) if endpoint.identity_files else "default keys in ~/.ssh")
        raise ConnectError(f"{where}: authentication failed for user {endpoint.user} (tried {tried})") from e
    except (OSError, EOFError) as e:
        client.close()
        raise ConnectError(f"{where}: cannot connect: {_describe_os_error(e)}") from e
    except paramiko.SSHException as e:
        client.close()
        raise ConnectError(f"{where}: SSH error: {e}") from e
    return client


# ---------------------------------------------------------------- tasks


class _ChannelStream(io.RawIOBase):
    """A channel's stdout or stderr as a binary stream with readline().

    Reads in large chunks and splits lines itself (paramiko's file objects go
    byte-wise through Python and are several times slower). At end of stream,
    a lost connection is reported as one last line.
    """

    _CHUNK = 65536

    def __init__(self, recv, on_eof=None):
        super().__init__()
        self._recv = recv
        self._buffer = bytearray()
        self._eof = False
        self.on_eof = on_eof

    def readable(self) -> bool:
        return True

    def unread(self, data: bytes) -> None:
        self._buffer[:0] = data

    def readline(self, size: int = -1) -> bytes:
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line
            if self._eof:
                break
            start = len(self._buffer)
            try:
                chunk = self._recv(self._CHUNK)
            except (OSError, EOFError, paramiko.SSHException) as e:
                if isinstance(e, socket.timeout):
                    raise
                chunk = b""
            if not chunk:
                self._eof = True
            self._buffer += chunk
        if self._buffer:
            line = bytes(self._buffer)
            self._buffer.clear()
            return line
        if self.on_eof is not None:
            note, self.on_eof = self.on_eof(), None
            return note
        return b""

    def readinto(self, buffer) -> int:
        line = self.readline()
        buffer[: len(line)] = line
        return len(line)


class SshTaskProcess(TaskProcess):
    def __init__(self, conn: _Connection, chan: paramiko.Channel, stderr: _ChannelStream, pgid: int, options: SshOptions):
        self._conn = conn
        self._chan = chan
        self._options = options
        self.pid = pgid
        self._closed = False
        self.stdout = _ChannelStream(chan.recv)
        self.stderr = stderr
        stderr.on_eof = self._eof_note

    def _eof_note(self) -> bytes:
        if self._conn.active or self.poll() != EXIT_CONNECTION_LOST:
            return b""
        return (
            f"mgpu: lost the SSH connection to {self._conn.endpoint.label}; "
            f"the remote task is killed when sshd notices\n"
        ).encode()

    def _status(self) -> int:
        sig = getattr(self._chan, "mgpu_exit_signal", None)
        if sig is not None:
            return -sig
        if self._chan.exit_status >= 0:
            return self._chan.exit_status
        return EXIT_CONNECTION_LOST

    def poll(self) -> int | None:
        if self._chan.exit_status_ready():
            return self._status()
        if not self._conn.active:
            return EXIT_CONNECTION_LOST
        return None

    def signal_tree(self, signum: int) -> None:
        if self.poll() is not None or not self._conn.active:
            # Gone, or unreachable: then sshd closes the session and the remote watcher kills the group.
            return
        try:
            self._conn.run(remote_command.signal_command(self.pid, signum), self._options.connect_timeout)
        except MgpuError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing the channel ends the session; the remote watcher then kills anything left in the group.
        self._chan.close()
        with self._conn.lock:
            self._conn.sessions -= 1


class SshRunner(Runner):
    """Starts tasks on remote hosts; one connection per host, shared by its tasks."""

    def __init__(self, options: SshOptions = SshOptions()):
        self.options = options
        self._config = _load_ssh_config(options.ssh_config)
        self._lock = threading.Lock()
        self._host_locks: dict[Endpoint, threading.Lock] = {}
        self._connections: dict[Endpoint, list[_Connection]] = {}

    def endpoint(self, task: TaskPlan) -> Endpoint:
        return resolve_endpoint(task.host, task.ssh, self._config)

    def resolved_address(self, host: str) -> str | None:
        """The IP address `host` means here, after ssh config's HostName; None if it does not resolve."""
        hostname = self._config.lookup(host).get("hostname", host)
        try:
            return socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)[0][4][0]
        except (OSError, UnicodeError):
            return None

    def connect(self, task: TaskPlan) -> _Connection:
        """A connection to the task's host with a free session slot (opens one if needed)."""
        endpoint = self.endpoint(task)
        with self._lock:
            host_lock = self._host_locks.setdefault(endpoint, threading.Lock())
        with host_lock:
            pool = self._connections.setdefault(endpoint, [])
            pool[:] = [c for c in pool if c.active or c.sessions > 0]
            for conn in pool:
                with conn.lock:
                    if conn.active and conn.sessions < _SESSIONS_PER_CONNECTION:
                        conn.sessions += 1
                        return conn
            conn = _connect(endpoint, self.options, self._config)
            conn.sessions = 1
            pool.append(conn)
            return conn

    def _release(self, conn: _Connection) -> None:
        with conn.lock:
            conn.sessions -= 1

    def run(self, task: TaskPlan, command: str, timeout: float) -> tuple[int, bytes, bytes]:
        """Run a short command on the task's host: (exit code, stdout, stderr)."""
        conn = self.connect(task)
        try:
            return conn.run(command, timeout)
        finally:
            self._release(conn)

    def task_env(self, task: TaskPlan, attempt: int) -> dict[str, str]:
        # Only what the plan adds (forwarded variables included): never the launcher's whole environment.
        env = dict(task.env)
        env[ENV_ATTEMPT] = str(attempt)
        return env

    def start(self, task: TaskPlan, attempt: int) -> TaskProcess:
        command = remote_command.task_command(task.argv, self.task_env(task, attempt), task.workdir, self.options.kill_grace)
        conn = self.connect(task)
        try:
            chan = conn.open_session(self.options.connect_timeout)
            try:
                try:
                    chan.exec_command(command)
                except (paramiko.SSHException, EOFError, OSError) as e:
                    raise ConnectError(f"{conn.endpoint.label}: cannot start the task: {e or type(e).__name__}") from e
                stderr = _ChannelStream(chan.recv_stderr)
                pgid = self._read_pgid(chan, stderr, conn)
            except BaseException:
                chan.close()
                raise
        except BaseException:
            self._release(conn)
            raise
        return SshTaskProcess(conn, chan, stderr, pgid, self.options)

    def _read_pgid(self, chan: paramiko.Channel, stderr: _ChannelStream, conn: _Connection) -> int:
        """Consume the wrapper's process-group line; lines the login shell printed before it stay in the stream."""
        before: list[bytes] = []
        chan.settimeout(self.options.connect_timeout)
        try:
            while True:
                line = stderr.readline()
                if not line:
                    break
                pgid = remote_command.parse_pgid_line(line)
                if pgid is not None:
                    stderr.unread(b"".join(before))
                    return pgid
                before.append(line)
        except socket.timeout:
            before.append(f"no answer within {self.options.connect_timeout:g} s".encode())
        finally:
            chan.settimeout(None)
        detail = b"".join(before).decode("utf-8", "replace").strip().splitlines()
        reason = detail[-1] if detail else ("the connection was lost" if not conn.active else "it exited")
        raise ConnectError(f"{conn.endpoint.label}: the remote shell did not start the task: {reason}")

    def close(self) -> None:
        with self._lock:
            pools = list(self._connections.values())
            self._connections.clear()
        for pool in pools:
            for conn in pool:
                conn.close()
