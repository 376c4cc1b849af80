"""Tasks on other machines, started over SSH with paramiko.

Settings for a host come from the spec (plan.ssh, CLI flags merged in) first, then the ssh
config file, then defaults, like OpenSSH (target.py). Host keys are checked against
~/.ssh/known_hosts plus an optional extra file; unknown keys are refused unless accepting new
ones was asked for, changed keys always (hostkeys.py). Tasks on one host share a connection
(this module's pool, over connection.py).

How a remote task is wrapped, and why nothing outlives its SSH session, is explained in
remote_command.py.
"""

from __future__ import annotations

import socket
import threading
from typing import Iterable

import paramiko

from launcher.errors import ConnectError
from launcher.plan.planner import TaskPlan
from launcher.protocol import attempt_env
from launcher.backends.base import DEFAULT_GRACE_PERIOD, Attempt, Backend, CpuUsage, TaskByTask, TaskProcess
from launcher.backends.ssh import remote_command
from launcher.backends.ssh.agent import HostAgents
from launcher.backends.ssh.connection import EXIT_CONNECTION_LOST, Connection, connect
from launcher.backends.ssh.handover import HANDOVER, Handover, task_line
from launcher.backends.ssh.on_task_host import OnTaskHost
from launcher.backends.ssh.options import SshOptions
from launcher.backends.ssh.stream import ChannelStream
from launcher.backends.ssh.target import SshTarget, load_ssh_config, resolve_target

# Sessions opened on one connection before another is opened; sshd's MaxSessions defaults to 10.
_SESSIONS_PER_CONNECTION = 8
SHELL_START_TIMEOUT = 60.0  # seconds for the remote login shell to start a task and answer


class SshTaskProcess(OnTaskHost, TaskProcess):
    def __init__(self, conn: Connection, chan: paramiko.Channel, stderr: ChannelStream, pgid: int, options: SshOptions,
                 own_port: int | None = None, coordinator_port: int | None = None, marker: bytes | None = None):
        self._conn = conn
        self._chan = chan
        self._options = options
        self.answer_timeout = options.connect_timeout
        self.pid = pgid
        self._closed = False
        self._lock = threading.Lock()
        self.stdout = ChannelStream(chan.recv)
        self.stderr = stderr
        stderr.on_eof = self._eof_note
        self._own_port = own_port
        self._coordinator_port = coordinator_port
        self._listening = False
        self._connected = False
        self._join_failed = marker is None  # no reporter beside the task
        self._usage: CpuUsage | None = None  # the reporter's latest
        self._stopped = False  # whether the reporter last said a process of the task is stopped
        if marker is not None:
            stderr.take_reports(marker, self._take_report)

    sessions = 1  # SSH sessions this task holds on its connection

    def _take_report(self, line: bytes) -> None:
        """A report of the join reporter, out of the task's stderr (see remote_command.py)."""
        report = line.decode("ascii", "replace")
        if report == remote_command.LISTENING:
            self._listening = True
        elif report == remote_command.CONNECTED:
            self._connected = True
        elif report in (remote_command.STOPPED, remote_command.RUNNING):
            self._stopped = report == remote_command.STOPPED
        elif (usage := remote_command.parse_usage(report)) is not None:
            self._usage = CpuUsage(*usage)

    def usage(self) -> CpuUsage | None:
        """Reported by the remote join reporter every couple of seconds (see remote_command.py)."""
        return self._usage

    def stopped(self) -> bool | None:
        """Reported by the remote join reporter when it changes (see remote_command.py)."""
        return None if self._join_failed else self._stopped

    def listens_on(self, port: int) -> bool | None:
        """Reported by the remote join reporter (see remote_command.py)."""
        if port != self._own_port or self._join_failed:
            return None
        return self._listening

    def joined(self, own_port: int | None, coordinator_port: int | None) -> bool | None:
        """Reported by the remote join reporter, which looks at the ports this task was started with."""
        if self._join_failed or (own_port, coordinator_port) == (None, None):
            return None
        if own_port not in (None, self._own_port) or coordinator_port not in (None, self._coordinator_port):
            return None  # not the ports being reported on
        return (own_port is not None and self._listening) or (coordinator_port is not None and self._connected)

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

    def lost(self) -> str | None:
        """Lost: the connection ended without the task's exit status (see _status)."""
        if self._conn.active or self._status() != EXIT_CONNECTION_LOST or self._chan.exit_status >= 0:
            return None
        return self._conn.lost_reason or "SSH connection lost"

    def signal_tree(self, signum: int) -> None:
        """Returns at once; the signal is sent from a background thread."""
        if self.poll() is not None or not self._conn.active:
            # Gone, or unreachable: then sshd closes the session and the remote hang-up guard kills the group.
            return
        self._conn.signal_group(self.pid, signum, self._options.connect_timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Closing the channel ends the session; the remote hang-up guard then kills anything left in
        # the group, and the join reporter ends on its own once the task has.
        self._chan.close()
        self._conn.release(self.sessions)


class SshBackend(Backend):
    """Starts tasks on remote hosts; one connection per host, shared by its tasks. Owns the
    connections; what runs on a remote host ends with its session (remote_command.py)."""

    def __init__(self, options: SshOptions = SshOptions(), grace_period: float = DEFAULT_GRACE_PERIOD):
        self.options = options
        self.grace_period = grace_period  # a task's remote tree gets it between TERM and KILL
        self._config = load_ssh_config(options.ssh_config)
        self._lock = threading.Lock()
        self._host_locks: dict[SshTarget, threading.Lock] = {}
        self._connections: dict[SshTarget, list[Connection]] = {}
        # Sessions the checks handed over to start tasks (take_handovers), by task name.
        self._handovers: dict[str, Handover] = {}
        self._agents = HostAgents(self) if options.host_agent else None  # None: --no-host-agent

    def target(self, task: TaskPlan) -> SshTarget:
        return resolve_target(task.host, task.ssh, self._config)

    def resolved_address(self, host: str) -> str | None:
        """The IP address `host` means here, after ssh config's HostName; None if it does not resolve."""
        hostname = self._config.lookup(host).get("hostname", host)
        try:
            return socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)[0][4][0]
        except (OSError, UnicodeError):
            return None

    def connect(self, task: TaskPlan, sessions: int = 1) -> Connection:
        """A connection to the task's host with `sessions` free session slots (opens one if needed)."""
        target = self.target(task)
        with self._lock:
            host_lock = self._host_locks.setdefault(target, threading.Lock())
        with host_lock:
            pool = self._connections.setdefault(target, [])
            pool[:] = [c for c in pool if c.active or c.sessions > 0]
            for conn in pool:
                with conn.lock:
                    if conn.active and conn.sessions + sessions <= _SESSIONS_PER_CONNECTION:
                        conn.sessions += sessions
                        return conn
            conn = connect(target, self.options, self._config)
            conn.sessions = sessions
            pool.append(conn)
            return conn

    def run(self, task: TaskPlan, command: str, timeout: float, conversation=None,
            limit: int | None = None) -> tuple[int, bytes, bytes]:
        """Run a short command on the task's host: (exit code, stdout, stderr); `conversation` and
        `limit`: see Connection.run."""
        conn = self.connect(task)
        try:
            return conn.run(command, timeout, conversation, limit)
        finally:
            conn.release()

    def run_for_handover(self, task: TaskPlan, command: str, timeout: float, conversation=None,
                         limit: int | None = None) -> tuple[int, bytes, bytes, Handover | None]:
        """As `run`, for a command of handover.handover_script: (exit code, stdout, stderr, None) when
        it ended, or (0, stdout, stderr, the Handover whose session starts `task`) when it handed its
        session over. The caller owns that: it gives it to take_handovers, or closes it."""
        conn = self.connect(task)
        kept = None
        try:
            code, out, err, kept = conn.run_until_handover(command, timeout, conversation, HANDOVER.encode(), limit)
            if kept is None:
                return code, out, err, None
            return 0, out, err, Handover(task.name, conn.target, conn, kept)
        finally:
            if kept is None:
                conn.release()

    def take_handovers(self, handovers: Iterable[Handover]) -> None:
        """`start` starts each handover's task in its session, not in a new one (a task's session
        taken before is closed). The backend owns them now: `close` ends those still unused."""
        replaced = []
        with self._lock:
            for handover in handovers:
                if (before := self._handovers.get(handover.task)) is not None and before is not handover:
                    replaced.append(before)
                self._handovers[handover.task] = handover
        for handover in replaced:
            handover.close()

    def handover_for(self, task: TaskPlan) -> Handover | None:
        """The session handed over to start `task`, if one was (it may have ended since: `start` then
        opens another)."""
        with self._lock:
            handover = self._handovers.pop(task.name, None)
        if handover is not None and handover.target != self.target(task):  # the task moved to another host (a spare's)
            handover.close()
            return None
        return handover

    def handovers_to(self, target: SshTarget) -> list[Handover]:
        """The sessions handed over to start tasks on `target`, taken: the caller owns them."""
        with self._lock:
            names = [name for name, handover in self._handovers.items() if handover.target == target]
            return [self._handovers.pop(name) for name in names]

    def task_env(self, task: TaskPlan, attempt: int) -> dict[str, str]:
        # Only what the plan adds (forwarded variables included): never the launcher's whole environment.
        env = dict(task.env)
        env.update(attempt_env(attempt))
        return env

    def begin_attempt(self, tasks, attempt: int) -> Attempt:
        # Each start waits for a remote login shell; one connection's sessions open safely from threads.
        return TaskByTask(self.start, attempt, together=True)

    def start(self, task: TaskPlan, attempt: int) -> TaskProcess:
        """Start the task; its join reporter looks at its own port and the coordinator's. A session
        its host's check handed over (take_handovers) starts the host's first task."""
        nonce = remote_command.new_nonce()
        reporter = remote_command.join_report_command("$$", task.port, task.coordinator_port, nonce)
        remote = remote_command.task_command(task.argv, self.task_env(task, attempt), task.workdir,
                                             self.grace_period, reporter)
        if self._agents is not None:
            return self._agents.start(task, attempt)
        handover = self.handover_for(task)
        if handover is not None:
            try:
                return self._begin(remote, nonce, task, handover.connection, handover.channel)
            except ConnectError:
                pass  # the handed-over session ended before it started the task: a session of its own then
        return self._begin(remote, nonce, task, self.connect(task, SshTaskProcess.sessions), None)

    def _begin(self, remote: remote_command.RemoteTask, nonce: str, task: TaskPlan, conn: Connection,
               handed_over: paramiko.Channel | None) -> SshTaskProcess:
        """Start `remote` in the `handed_over` session, or with None in a new session of `conn`; either
        way the task's session slots on `conn` are taken already, and given back if the start fails."""
        chan = handed_over
        try:
            if chan is None:
                chan = conn.open_session(self.options.connect_timeout)
            try:
                try:
                    if handed_over is not None:
                        chan.sendall(task_line(remote))
                    else:
                        chan.exec_command(remote.command)
                        chan.sendall(remote.stdin)  # the env values: never on a command line
                except (paramiko.SSHException, EOFError, OSError) as e:
                    raise ConnectError(f"{conn.target.label}: cannot start the task: {e or type(e).__name__}") from e
                stderr = ChannelStream(chan.recv_stderr)
                pgid = self._read_pgid(chan, stderr, conn)
            except BaseException:
                chan.close()
                raise
        except BaseException:
            conn.release(SshTaskProcess.sessions)
            raise
        return SshTaskProcess(conn, chan, stderr, pgid, self.options, task.port, task.coordinator_port,
                              remote_command.report_marker(nonce))

    def _read_pgid(self, chan: paramiko.Channel, stderr: ChannelStream, conn: Connection) -> int:
        """Consume the wrapper's process-group line; lines the login shell printed before it stay in the stream."""
        before: list[bytes] = []
        # The login shell runs first: its start-up files (conda, module, pyenv init) may take
        # seconds on a healthy host, more than a connection does.
        wait = max(self.options.connect_timeout, SHELL_START_TIMEOUT)
        chan.settimeout(wait)
        try:
            while True:
                line = stderr.readline()
                if not line:
                    break
                shell_output, pgid = remote_command.split_pgid_line(line)
                if pgid is not None:
                    stderr.unread(b"".join(before) + shell_output)
                    return pgid
                before.append(line)
        except socket.timeout:
            before.append(f"no answer within {wait:g} s".encode())
        finally:
            chan.settimeout(None)
        detail = b"".join(before).decode("utf-8", "replace").strip().splitlines()
        reason = detail[-1] if detail else ("the connection was lost" if not conn.active else "it exited")
        raise ConnectError(f"{conn.target.label}: the remote shell did not start the task: {reason}")

    def close(self) -> None:
        with self._lock:
            pools = list(self._connections.values())
            self._connections.clear()
            handovers, self._handovers = list(self._handovers.values()), {}
        for handover in handovers:
            handover.close()
        if self._agents is not None:
            self._agents.close()
        for pool in pools:
            for conn in pool:
                conn.close()
