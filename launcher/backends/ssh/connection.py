"""Authenticated SSH connections: login (host keys, jump hosts), keepalives, commands, signals."""

from __future__ import annotations

import os
import socket
import threading
import time

import paramiko

from launcher.config.addresses import Endpoint
from launcher.config.spec import SshSettings
from launcher.errors import ConnectError, HostKeyError, MgpuError, UnreadableAnswer
from launcher.backends.ssh import hostkeys, known_hosts, remote_command
from launcher.backends.ssh.options import SshOptions
from launcher.backends.ssh.target import SshTarget, resolve_target
from launcher.backends.ssh.transport import LOG_CHANNEL, SignalStatusTransport

# Exit code reported when the connection died before the task's status arrived (as ssh(1) does).
EXIT_CONNECTION_LOST = 255
# Unanswered keepalives before a connection counts as dead (ssh's ServerAliveCountMax).
_KEEPALIVE_COUNT_MAX = 3
# Channel window: how much of a session's output the remote host sends ahead of what the launcher
# has read. It is what the launcher may hold unread per session, so it bounds the launcher's memory
# (with 8 MiB, 32 flooding tasks took hundreds of MiB) and what is still in flight when a task ends;
# a task that writes faster waits on its host. Eight of paramiko's 32 KiB packets: far more than
# a LAN's round trip needs.
_WINDOW_SIZE = 256 * 1024


def _describe_os_error(e: BaseException) -> str:
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {err.strerror or str(err) for err in e.errors.values()}
        return "; ".join(sorted(reasons))
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve name ({e.strerror})"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


class Connection:
    """One authenticated SSH connection, with a keepalive thread that closes it when the peer is gone."""

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
        self.keepalives_answered = 0
        self.lost_reason: str | None = None  # why the keepalives closed it
        if keepalive > 0:
            threading.Thread(target=self._keep_alive, args=(keepalive,), daemon=True, name=f"ssh-keepalive {target.alias}").start()

    def release(self, sessions: int = 1) -> None:
        """Give back the session slots SshBackend.connect took."""
        with self.lock:
            self.sessions -= sessions

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
                    pass  # unreachable: when sshd ends the session, the remote hang-up guard kills the group

    def _keep_alive(self, interval: float) -> None:
        while not self._closed.wait(interval):
            if not self.transport.is_active():
                return
            answered = threading.Event()

            def ping():
                try:
                    # OpenSSH answers unknown global requests with a failure: any answer proves it is alive.
                    self.transport.global_request("keepalive@openssh.com", wait=True)
                    if self.transport.is_active():
                        self.keepalives_answered += 1
                finally:
                    answered.set()

            threading.Thread(target=ping, daemon=True).start()
            if not answered.wait(interval * _KEEPALIVE_COUNT_MAX):
                self.lost_reason = "SSH keepalives unanswered"
                self.transport.close()
                return

    def answers(self, timeout: float) -> bool:
        """Whether the host answers a keepalive within `timeout` seconds. One that does not is judged
        gone at once and the connection closed, as the keepalives would close it later: asked when a
        job has stalled, where a host cut off never sends its tasks' stacks and its keepalives may take
        up to four of their intervals to run out."""
        if not self.active:
            return False
        answered = threading.Event()

        def ping():
            try:
                self.transport.global_request("keepalive@openssh.com", wait=True)
                if self.transport.is_active():
                    answered.set()
            except Exception:  # noqa: BLE001 - a connection that fails to ask is one that does not answer
                pass

        threading.Thread(target=ping, daemon=True, name=f"ssh-answers {self.target.alias}").start()
        if answered.wait(timeout):
            return True
        if self.active:
            self.lost_reason = f"no answer over SSH within {timeout:g} s while its tasks stalled"
            self.transport.close()
        return False

    @property
    def active(self) -> bool:
        return self.transport is not None and self.transport.is_active()

    def open_session(self, timeout: float) -> paramiko.Channel:
        try:
            return self.transport.open_session(window_size=_WINDOW_SIZE, timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectError(f"{self.target.label}: cannot open an SSH session: {e}") from e

    def run(self, command: str, timeout: float, conversation=None, limit: int | None = None
            ) -> tuple[int, bytes, bytes]:
        """Run a command to completion; (exit code, stdout, stderr). Raises ConnectError on timeout,
        and with `limit`, UnreadableAnswer (its reason) once stdout or stderr brings more bytes.

        Without `conversation` the command's stdin is at its end from the start. With one (see
        preflight/on_host.py's Conversation), stdin stays open for what it says, and it hears each
        line of stdout as it comes."""
        status, out, err, _ = self._run(command, timeout, conversation, None, limit)
        return status, out, err

    def run_until_handover(self, command: str, timeout: float, conversation, handover: bytes,
                           limit: int | None = None) -> tuple[int, bytes, bytes, paramiko.Channel | None]:
        """As `run`, for a command that may end with the line `handover` on both stdout and stderr and
        then wait, its session kept for what comes next (handover.py): (exit code, stdout, stderr,
        None) when it ended, or (-1, stdout, stderr, the open channel) without the two lines when it
        hands its session over. The conversation hears nothing after that; the caller owns the channel."""
        return self._run(command, timeout, conversation, handover + b"\n", limit)

    def _run(self, command: str, timeout: float, conversation, handover: bytes | None, limit: int | None = None
             ) -> tuple[int, bytes, bytes, paramiko.Channel | None]:
        chan = self.open_session(timeout)
        kept = None
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            if conversation is None:
                chan.shutdown_write()
            else:
                conversation.attach(chan.sendall)
            out, err = bytearray(), bytearray()
            heard = 0  # how much of `out` the conversation has heard: whole lines only
            deadline = time.monotonic() + timeout
            while not (chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready() and chan.eof_received):
                if time.monotonic() > deadline:
                    raise ConnectError(f"{self.target.label}: command did not finish within {timeout:g} s")
                got = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                    if conversation is not None:
                        while (end := out.find(b"\n", heard)) >= 0:
                            conversation.heard(bytes(out[heard:end]))
                            heard = end + 1
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if limit is not None and max(len(out), len(err)) > limit:
                    raise UnreadableAnswer(f"more than {limit >> 20} MiB on {'stdout' if len(out) > limit else 'stderr'}")
                if handover is not None and _ends_with_line(out, handover) and _ends_with_line(err, handover):
                    # Nothing more comes until the caller speaks: what follows is the task's.
                    if conversation is not None:
                        conversation.detach()
                    chan.settimeout(None)
                    kept = chan
                    return -1, bytes(out[:-len(handover)]), bytes(err[:-len(handover)]), chan
                if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if not got:
                    time.sleep(0.02)
            status = chan.exit_status if chan.exit_status_ready() else EXIT_CONNECTION_LOST
            return status, bytes(out), bytes(err), None
        except socket.timeout as e:
            raise ConnectError(f"{self.target.label}: command did not finish within {timeout:g} s") from e
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise ConnectError(f"{self.target.label}: {e or type(e).__name__}") from e
        finally:
            if conversation is not None:
                conversation.detach()
            if kept is None:
                chan.close()

    def close(self) -> None:
        self._closed.set()
        self.client.close()
        for jump in reversed(self.jumps):
            jump.close()


def _ends_with_line(data: bytearray, line: bytes) -> bool:
    """Whether `data`'s last line is `line` (which ends with its newline)."""
    return data.endswith(line) and (len(data) == len(line) or data[-len(line) - 1:-len(line)] == b"\n")


def connect(target: SshTarget, options: SshOptions, config: paramiko.SSHConfig) -> Connection:
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
    return Connection(target, client, clients, options.keepalive)


def _proxy_command(target: SshTarget):
    """The ssh config's ProxyCommand for the first hop, as a socket (None: connect directly)."""
    if not target.proxy_command:
        return None
    try:
        return paramiko.ProxyCommand(target.proxy_command)
    except (paramiko.SSHException, OSError) as e:
        raise ConnectError(f"{target.label}: ProxyCommand {target.proxy_command!r} failed: {e}") from e


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


def _known_hosts_policy(options: SshOptions) -> hostkeys.HostKeyPolicy:
    """Keys from ~/.ssh/known_hosts and --known-hosts alike; new ones go to the latter if given."""
    record_in = hostkeys.default_known_hosts()
    files = [record_in]
    if options.known_hosts:
        record_in = os.path.expanduser(options.known_hosts)
        files.append(record_in)
    return hostkeys.HostKeyPolicy(options.accept_new_host_keys, record_in, known_hosts.load(files))


def _transport_preferring(key_types: tuple[str, ...]):
    """A transport factory that asks first for the host key types known_hosts lists (as ssh
    does), so a host with several keys is judged by one that is known."""
    wanted = [alias for t in key_types for alias in (("rsa-sha2-512", "rsa-sha2-256", t) if t == "ssh-rsa" else (t,))]

    def make(*args, **kwargs) -> SignalStatusTransport:
        transport = SignalStatusTransport(*args, **kwargs)
        options = transport.get_security_options()
        first = [t for t in wanted if t in options.key_types]
        options.key_types = first + [t for t in options.key_types if t not in first]
        return transport

    return make


def _login(target: SshTarget, options: SshOptions, sock, via: tuple[Endpoint, ...] = ()) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_log_channel(LOG_CHANNEL)
    policy = _known_hosts_policy(options)
    client.set_missing_host_key_policy(policy)
    key_name = hostkeys.known_hosts_name(target.hostname, target.port)
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
            sock=sock if sock is not None else _proxy_command(target),
            transport_factory=_transport_preferring(known_hosts.known_types(policy.entries, key_name)),
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
