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
import logging
import os
import signal
import socket
import threading
import time
import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

from launcher import hostkeys
from launcher.errors import ConnectError, HostKeyError, MgpuError, UsageError
from launcher.params import Endpoint, parse_endpoint
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

# paramiko logs every failed handshake with a traceback; errors reach the user as one ConnectError line instead.
_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
_paramiko_log.propagate = False


def enable_debug_logging() -> None:
    """Let paramiko's own log (handshakes, tracebacks) through to stderr, for --debug."""
    if not any(isinstance(h, logging.StreamHandler) for h in _paramiko_log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("paramiko: %(levelname)s %(message)s"))
        _paramiko_log.addHandler(handler)
    _paramiko_log.setLevel(logging.DEBUG)


# ---------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class SshTarget:
    """A host as OpenSSH would reach it: spec settings over ssh config over defaults."""

    alias: str  # the name in the spec
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: tuple[Endpoint, ...]  # jump hosts, outermost first

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


def resolve_target(alias: str, settings: SshSettings | None, config: paramiko.SSHConfig) -> SshTarget:
    """Raises UsageError for a ProxyJump that is not `[user@]host[:port],...`, and ConnectError
    for an identity file given in the spec or on the command line that does not exist."""
    settings = settings or SshSettings()
    found = config.lookup(alias)
    port = settings.port if settings.port is not None else int(found.get("port", 22))
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
    return SshTarget(alias, found.get("hostname", alias), port, user, identities, tuple(jumps))


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

    def __init__(self, target: SshTarget, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient], keepalive: float):
        self.target = target
        self.client = client
        self.jumps = jumps  # jump host connections this one tunnels through
        self.sessions = 0
        self.lock = threading.Lock()
        self.transport = client.get_transport()
        self._closed = threading.Event()
        self._signals: list[tuple[int, int]] = []  # (process group, signal) not sent yet
        self._signalling = False
        if keepalive > 0:
            threading.Thread(target=self._watch, args=(keepalive,), daemon=True, name=f"ssh-keepalive {target.alias}").start()

    def release(self) -> None:
        """Give back the session slot SshRunner.connect took."""
        with self.lock:
            self.sessions -= 1

    def signal_group(self, pgid: int, signum: int, timeout: float) -> None:
        """Signal a remote process group without waiting for it. Signals asked for while a
        command is under way go out together in the next one, so stopping many tasks takes
        one round trip and one extra session, however slow the host."""
        with self.lock:
            self._signals.append((pgid, signum))
            if self._signalling:
                return
            self._signalling = True
        threading.Thread(target=self._send_signals, args=(timeout,), daemon=True,
                         name=f"ssh-signal {self.target.alias}").start()

    def _send_signals(self, timeout: float) -> None:
        while True:
            with self.lock:
                batch, self._signals = self._signals, []
                if not batch:
                    self._signalling = False
                    return
            for signum in dict.fromkeys(sig for _, sig in batch):  # in the order asked, TERM before KILL
                groups = list(dict.fromkeys(pgid for pgid, sig in batch if sig == signum))
                try:
                    self.run(remote_command.signal_command(groups, signum), timeout)
                except MgpuError:
                    pass  # unreachable: when sshd ends the session, the remote watcher kills the group

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
            raise ConnectError(f"{self.target.label}: cannot open an SSH session: {e}") from e

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
                    raise ConnectError(f"{self.target.label}: command did not finish within {timeout:g} s")
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
            raise ConnectError(f"{self.target.label}: command did not finish within {timeout:g} s") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise ConnectError(f"{self.target.label}: {e or type(e).__name__}") from e
        finally:
            chan.close()

    def close(self) -> None:
        self._closed.set()
        self.client.close()
        for jump in reversed(self.jumps):
            jump.close()


def _connect(target: SshTarget, options: SshOptions, config: paramiko.SSHConfig) -> _Connection:
    """Connect and log in, through the target's jump hosts if any. Raises ConnectError/HostKeyError."""
    hops = [resolve_target(jump.host, SshSettings(user=jump.user, port=jump.port), config) for jump in target.proxy_jump]
    clients: list[paramiko.SSHClient] = []
    try:
        sock = None
        for hop, following in zip(hops, hops[1:] + [target]):
            clients.append(_login(hop, options, sock))
            try:
                # The next hop is reached through a direct-tcpip channel of this one, like ssh -J.
                sock = clients[-1].get_transport().open_channel(
                    "direct-tcpip", (following.hostname, following.port), ("127.0.0.1", 0), timeout=options.connect_timeout
                )
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise ConnectError(
                    f"{target.label}: jump host {hop.label} cannot reach {following.hostname}:{following.port}: {e}"
                ) from e
        client = _login(target, options, sock, via=target.proxy_jump)
    except BaseException:
        for jump in reversed(clients):
            jump.close()
        raise
    return _Connection(target, client, clients, options.keepalive)


def _handshake_problem(client: paramiko.SSHClient, timeout: float) -> str | None:
    """Why the SSH handshake did not complete; None if it did (or never began).

    paramiko's connect() stops waiting for the handshake after `timeout` without
    saying so, and its next step then fails with an unrelated error ("No existing
    session"); the transport knows the real cause.
    """
    transport = client.get_transport()
    if transport is None or transport.initial_kex_done:
        return None
    saved = transport.get_exception()
    if not transport.remote_version:
        cause = saved.__context__ if isinstance(saved, paramiko.SSHException) else saved
        if saved is None or isinstance(cause, socket.timeout):
            return f"no SSH banner within {timeout:g} s"
        if isinstance(cause, EOFError):
            return "the server closed the connection before sending an SSH banner"
    if saved is not None:
        return str(saved) or type(saved).__name__
    return f"the SSH handshake did not finish within {timeout:g} s"


def _login(target: SshTarget, options: SshOptions, sock, via: tuple[Endpoint, ...] = ()) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    record_in = hostkeys.default_known_hosts()
    if options.known_hosts:
        record_in = os.path.expanduser(options.known_hosts)
        if os.path.exists(record_in):
            client.load_host_keys(record_in)
    client.set_missing_host_key_policy(_HostKeyPolicy(options.accept_new_host_keys, record_in))
    where = target.label + (f" via {','.join(map(str, via))}" if via else "")
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=list(target.identity_files) or None,
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
                target.hostname, target.port, e.key.get_name(), hostkeys.sha256_fingerprint(e.key.asbytes())
            )
        ) from e
    except paramiko.AuthenticationException as e:
        client.close()
        tried = "ssh-agent, " + (", ".join(target.identity_files) if target.identity_files else "default keys in ~/.ssh")
        raise ConnectError(f"{where}: authentication failed for user {target.user} (tried {tried})") from e
    except (OSError, EOFError, paramiko.SSHException) as e:
        problem = _handshake_problem(client, options.connect_timeout)
        client.close()
        if problem is not None:
            raise ConnectError(f"{where}: {problem}") from e
        if str(e) == "No authentication methods available":  # paramiko found no key to offer
            raise ConnectError(
                f"{where}: authentication failed for user {target.user} (no key to try: none in ssh-agent, "
                f"no IdentityFile, no default keys in ~/.ssh)"
            ) from e
        if isinstance(e, paramiko.SSHException):
            raise ConnectError(f"{where}: SSH error: {e}") from e
        raise ConnectError(f"{where}: cannot connect: {_describe_os_error(e)}") from e
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
            f"mgpu: lost the SSH connection to {self._conn.target.label}; "
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
        """Returns at once; the signal is sent from a background thread."""
        if self.poll() is not None or not self._conn.active:
            # Gone, or unreachable: then sshd closes the session and the remote watcher kills the group.
            return
        self._conn.signal_group(self.pid, signum, self._options.connect_timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing the channel ends the session; the remote watcher then kills anything left in the group.
        self._chan.close()
        self._conn.release()


class SshRunner(Runner):
    """Starts tasks on remote hosts; one connection per host, shared by its tasks."""

    def __init__(self, options: SshOptions = SshOptions()):
        self.options = options
        self._config = _load_ssh_config(options.ssh_config)
        self._lock = threading.Lock()
        self._host_locks: dict[SshTarget, threading.Lock] = {}
        self._connections: dict[SshTarget, list[_Connection]] = {}

    def target(self, task: TaskPlan) -> SshTarget:
        return resolve_target(task.host, task.ssh, self._config)

    def resolved_address(self, host: str) -> str | None:
        """The IP address `host` means here, after ssh config's HostName; None if it does not resolve."""
        hostname = self._config.lookup(host).get("hostname", host)
        try:
            return socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)[0][4][0]
        except (OSError, UnicodeError):
            return None

    def connect(self, task: TaskPlan) -> _Connection:
        """A connection to the task's host with a free session slot (opens one if needed)."""
        target = self.target(task)
        with self._lock:
            host_lock = self._host_locks.setdefault(target, threading.Lock())
        with host_lock:
            pool = self._connections.setdefault(target, [])
            pool[:] = [c for c in pool if c.active or c.sessions > 0]
            for conn in pool:
                with conn.lock:
                    if conn.active and conn.sessions < _SESSIONS_PER_CONNECTION:
                        conn.sessions += 1
                        return conn
            conn = _connect(target, self.options, self._config)
            conn.sessions = 1
            pool.append(conn)
            return conn

    def run(self, task: TaskPlan, command: str, timeout: float) -> tuple[int, bytes, bytes]:
        """Run a short command on the task's host: (exit code, stdout, stderr)."""
        conn = self.connect(task)
        try:
            return conn.run(command, timeout)
        finally:
            conn.release()

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
                    raise ConnectError(f"{conn.target.label}: cannot start the task: {e or type(e).__name__}") from e
                stderr = _ChannelStream(chan.recv_stderr)
                pgid = self._read_pgid(chan, stderr, conn)
            except BaseException:
                chan.close()
                raise
        except BaseException:
            conn.release()
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
        raise ConnectError(f"{conn.target.label}: the remote shell did not start the task: {reason}")

    def close(self) -> None:
        with self._lock:
            pools = list(self._connections.values())
            self._connections.clear()
        for pool in pools:
            for conn in pool:
                conn.close()
