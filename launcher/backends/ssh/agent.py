"""The launcher's end of the host agents (`--host-agent`): one session per host runs host_agent.py,
which starts every task of the host, in every attempt, and frames their output back.

A host's agent starts in the session its checks ran in (a handover: handover.py), or without the
checks in a session of its own, at the host's first task; it stays for the run, so a restart starts
its tasks with no new login. Each task is an `AgentTaskProcess`, which answers as an
`SshTaskProcess` does: its two streams (read through the same ChannelStream, fed by the agent's
frames), its status, the join reporter's words, signals to its group, py-spy on the run's connection.

What the launcher holds of a task's output is bounded by the credit it grants each stream
(STREAM_WINDOW): the agent reads a task's pipe only while its stream has credit, so a task that
writes faster than the launcher reads waits on its host, and the others' output passes it by. A
host's agent session then holds at most its tasks' windows and the channel's own window.
"""

from __future__ import annotations

import json
import pathlib
import secrets
import shlex
import socket
import struct
import threading
import time

import paramiko

from launcher.backends.base import CpuUsage, TaskProcess
from launcher.backends.ssh import host_agent as wire, remote_command
from launcher.backends.ssh.connection import EXIT_CONNECTION_LOST, Connection
from launcher.backends.ssh.remote_command import RemoteTask
from launcher.backends.ssh.stream import ChannelStream
from launcher.errors import ConnectError, MgpuError
from launcher.host import py_spy
from launcher.plan.planner import TaskPlan

STREAM_WINDOW = 64 * 1024  # bytes of a task's stdout, and of its stderr, the launcher may hold unread
_CREDIT_AT = STREAM_WINDOW // 4  # bytes read before the credit is given back
_PREAMBLE_LIMIT = 1 << 20  # what a login shell may print on stdout before the agent's first line
_STDERR_TAIL = 4096  # of the agent's own stderr, kept for the reason it ended
_START_TIMEOUT = 30.0  # seconds for a running agent to start a task
_SHELL_START_TIMEOUT = 60.0  # seconds for a login shell to start the agent (its start-up files run first)

# Reads exactly its source's length from descriptor 3 (the session's stdin) and runs it; the
# environment comes on its stdin, from `env -0` in the starting shell, before any interpreter shim.
_BOOT = ("import os,sys\nn=int(sys.argv[1]);b=bytearray()\nwhile len(b)<n:\n c=os.read(3,n-len(b))\n"
         " if not c:sys.exit(255)\n b+=c\nexec(compile(bytes(b),'mgpu-host-agent','exec'),{'__name__':'__main__'})")


def agent_source() -> bytes:
    return pathlib.Path(wire.__file__).read_bytes()


def agent_command(nonce: str) -> RemoteTask:
    """The command that starts the agent in a session (or a handed-over check's shell), and its
    stdin: the agent's source. The host's python3 runs it."""
    source = agent_source()
    command = (f"exec 3<&0; env -0 2>/dev/null | exec python3 -c {shlex.quote(_BOOT)} {len(source)} {nonce}")
    return RemoteTask(command, source)


class _Inbox:
    """One stream of a task as the agent's frames bring it: `recv` for ChannelStream, which gives
    credit back to the agent as it is read."""

    def __init__(self, agent: "HostAgent", ident: int, stream: int):
        self._agent, self._ident, self._stream = agent, ident, stream
        self._data = bytearray()
        self._ended = False
        self._read = 0  # read since credit was last given back
        self._cond = threading.Condition()

    def feed(self, data: bytes) -> bool:
        """False when the agent sent more than the stream's credit allowed."""
        with self._cond:
            self._data += data
            self._cond.notify_all()
            return len(self._data) <= STREAM_WINDOW

    def held(self) -> int:
        with self._cond:
            return len(self._data)

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def recv(self, size: int) -> bytes:
        with self._cond:
            while not self._data and not self._ended:
                self._cond.wait()
            data = bytes(self._data[:size])
            del self._data[:size]
            self._read += len(data)
            give = self._read if self._read >= _CREDIT_AT or (not self._data and self._read) else 0
            self._read -= give
        if give and not self._ended:
            self._agent.send(wire.CREDIT, self._ident, struct.pack("!BI", self._stream, give))
        return data


class HostAgent:
    """A host's agent: its session, the thread that reads its frames, its tasks."""

    def __init__(self, conn: Connection, chan: paramiko.Channel):
        self.conn = conn
        self.chan = chan
        self.alive = True
        self.problem: str | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._tasks: dict[int, AgentTaskProcess] = {}
        self._next = 1
        self._stderr = bytearray()
        self._preamble: bytes | None = None  # what the login shell said on stderr before the agent, for the first task

    @classmethod
    def start(cls, conn: Connection, chan: paramiko.Channel | None, timeout: float, start_timeout: float
              ) -> "HostAgent":
        """Start the agent in `chan` (a handed-over check's session, its shell waiting for a line), or
        with None in a new session of `conn`; ConnectError when it does not say it is ready."""
        from launcher.backends.ssh.handover import task_line

        nonce = secrets.token_hex(8)
        remote = agent_command(nonce)
        handed_over = chan is not None
        try:
            if chan is None:
                chan = conn.open_session(timeout)
            if handed_over:
                chan.sendall(task_line(remote))
            else:
                chan.exec_command(remote.command)
                chan.sendall(remote.stdin)
            agent = cls(conn, chan)
            threading.Thread(target=agent._drain_stderr, daemon=True, name=f"agent-stderr {conn.target.alias}").start()
            agent._wait_ready(f"mgpu-agent-ready {nonce}\n".encode(), start_timeout)
            agent._preamble = bytes(agent._stderr)
        except (paramiko.SSHException, EOFError, OSError) as e:
            if chan is not None:
                chan.close()
            raise ConnectError(f"{conn.target.label}: cannot start mgpu's host agent: {e or type(e).__name__}") from e
        except BaseException:
            if chan is not None:
                chan.close()
            raise
        threading.Thread(target=agent._read_frames, daemon=True, name=f"agent {conn.target.alias}").start()
        return agent

    def _wait_ready(self, ready: bytes, timeout: float) -> None:
        seen = bytearray()
        deadline = time.monotonic() + timeout
        while not seen.endswith(ready) or (len(seen) > len(ready) and seen[-len(ready) - 1:-len(ready)] != b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or len(seen) > _PREAMBLE_LIMIT:
                raise ConnectError(f"{self.conn.target.label}: mgpu's host agent did not start within {timeout:g} s"
                                   + self._said())
            self.chan.settimeout(left)
            try:
                byte = self.chan.recv(1)
            except socket.timeout:
                continue
            if not byte:
                time.sleep(0.1)  # its stderr's last words
                raise ConnectError(f"{self.conn.target.label}: mgpu's host agent did not start" + self._said())
            seen += byte
        self.chan.settimeout(None)

    def _said(self) -> str:
        lines = bytes(self._stderr).decode("utf-8", "replace").strip().splitlines()
        return f": {lines[-1][:300]!r}" if lines else ""

    def _drain_stderr(self) -> None:
        while True:
            try:
                chunk = self.chan.recv_stderr(65536)
            except (OSError, EOFError, paramiko.SSHException):
                return
            if not chunk:
                return
            self._stderr += chunk
            del self._stderr[:-_STDERR_TAIL]

    def send(self, kind: int, ident: int, payload: bytes = b"") -> bool:
        """Send a frame; False when the agent's session is gone."""
        try:
            with self._send_lock:
                self.chan.sendall(wire.FRAME.pack(kind, ident, len(payload)) + payload)
            return True
        except (OSError, EOFError, paramiko.SSHException):
            return False

    def _read_frames(self) -> None:
        buffer = bytearray()
        try:
            while True:
                chunk = self.chan.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= wire.FRAME.size:
                    kind, ident, size = wire.FRAME.unpack_from(buffer)
                    if size > STREAM_WINDOW or len(buffer) < wire.FRAME.size + size:
                        if size > STREAM_WINDOW:
                            raise ValueError(f"a frame of {size} bytes")
                        break
                    payload = bytes(buffer[wire.FRAME.size:wire.FRAME.size + size])
                    del buffer[:wire.FRAME.size + size]
                    with self._lock:
                        task = self._tasks.get(ident)
                    if task is not None and not task.take(kind, payload):
                        raise ValueError(f"a frame it had no credit for, or unreadable ({chr(kind)!r})")
        except (OSError, EOFError, paramiko.SSHException, ValueError) as e:
            self.problem = f"mgpu's host agent broke its protocol: {e}" if isinstance(e, ValueError) else None
        self.alive = False
        self.chan.close()
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            task.agent_gone()

    def start_task(self, task: TaskPlan, env: dict[str, str], grace_period: float) -> "AgentTaskProcess":
        tags = [f"{name}={env[name]}" for name in remote_command.TAG_NAMES if name in env]
        tags = tags if all(name in env for name in remote_command.TAG_NAMES[1:]) else []
        spec = {"argv": list(task.argv), "env": env, "workdir": task.workdir, "grace": int(-(-grace_period // 1)),
                "tags": tags, "own": task.port, "coord": task.coordinator_port, "window": STREAM_WINDOW}
        with self._lock:
            ident, self._next = self._next, self._next + 1
            process = AgentTaskProcess(self, ident, task)
            self._tasks[ident] = process
        with self._lock:
            preamble, self._preamble = self._preamble, None
        if preamble:  # a start-up file's words stay where a session of its own puts them: in the task's stderr
            process.stderr.unread(preamble)
        payload = json.dumps(spec).encode("utf-8", "surrogateescape")
        if not self.alive or not self.send(wire.START, ident, payload):
            raise ConnectError(f"{self.conn.target.label}: mgpu's host agent has ended")
        if not process.started.wait(_START_TIMEOUT) or process.pid is None:
            raise ConnectError(f"{self.conn.target.label}: mgpu's host agent did not start {task.name}")
        return process

    def forget(self, ident: int) -> None:
        with self._lock:
            self._tasks.pop(ident, None)

    def close(self) -> None:
        """End the agent: at the end of its stdin it ends every task it still has (the hang-up guard)."""
        self.chan.close()
        self.conn.release()


class AgentTaskProcess(TaskProcess):
    """A task its host's agent started (see the module docstring)."""

    def __init__(self, agent: HostAgent, ident: int, task: TaskPlan):
        self._agent = agent
        self._ident = ident
        self._own_port = task.port
        self._coordinator_port = task.coordinator_port
        self.pid = None  # the process group, once the agent says it started
        self.started = threading.Event()
        self._status: int | None = None
        self._closed = False
        self._inboxes = {1: _Inbox(agent, ident, 1), 2: _Inbox(agent, ident, 2)}
        self.stdout = ChannelStream(self._inboxes[1].recv)
        self.stderr = ChannelStream(self._inboxes[2].recv, on_eof=self._eof_note)
        self._listening = self._connected = self._stopped = False
        self._usage: CpuUsage | None = None

    def take(self, kind: int, payload: bytes) -> bool:
        """A frame of the agent's about this task; False for one it cannot be."""
        if kind in (wire.OUT, wire.ERR):
            return self._inboxes[1 if kind == wire.OUT else 2].feed(payload)
        text = payload.decode("ascii", "replace")
        if kind == wire.STARTED and text.isdigit() and len(text) <= 10 and self.pid is None:
            self.pid = int(text)  # 0: the agent could not start it, and its EXIT follows
            self.started.set()
        elif kind == wire.EOF and text in ("1", "2"):
            self._inboxes[int(text)].end()
        elif kind == wire.EXIT and text.lstrip("-").isdigit() and -128 <= int(text[:5]) <= 255:
            self._status = int(text)
        elif kind == wire.REPORT:
            if text == remote_command.LISTENING:
                self._listening = True
            elif text == remote_command.CONNECTED:
                self._connected = True
            elif text in (remote_command.STOPPED, remote_command.RUNNING):
                self._stopped = text == remote_command.STOPPED
            elif (usage := remote_command.parse_usage(text)) is not None:
                self._usage = CpuUsage(*usage)
        else:
            return False
        return True

    def unread(self) -> int:
        """Bytes of the task's output the launcher holds that no reader has taken yet."""
        return sum(inbox.held() for inbox in self._inboxes.values())

    def agent_gone(self) -> None:
        self.started.set()
        for inbox in self._inboxes.values():
            inbox.end()

    def _eof_note(self) -> bytes:
        if self._status is not None or self._agent.alive:
            return b""
        if not self._agent.conn.active:
            return (f"mgpu: lost the SSH connection to {self._agent.conn.target.label}; "
                    f"the remote task is killed when sshd notices\n").encode()
        return f"mgpu: lost the host agent on {self._agent.conn.target.label}: {self.lost()}\n".encode()

    def poll(self) -> int | None:
        if self._status is not None:
            return self._status
        return None if self._agent.alive else EXIT_CONNECTION_LOST

    def lost(self) -> str | None:
        """Lost: the agent's session ended before the task's exit status came."""
        if self._status is not None or self._agent.alive:
            return None
        if not self._agent.conn.active:
            return self._agent.conn.lost_reason or "SSH connection lost"
        return self._agent.problem or "mgpu's host agent ended"

    def usage(self) -> CpuUsage | None:
        return self._usage

    def stopped(self) -> bool | None:
        return self._stopped

    def listens_on(self, port: int) -> bool | None:
        return self._listening if port == self._own_port else None

    def joined(self, own_port: int | None, coordinator_port: int | None) -> bool | None:
        if (own_port, coordinator_port) == (None, None):
            return None
        if own_port not in (None, self._own_port) or coordinator_port not in (None, self._coordinator_port):
            return None
        return (own_port is not None and self._listening) or (coordinator_port is not None and self._connected)

    def spy_stacks(self, native: bool, task: TaskPlan, timeout: float) -> py_spy.Answer | None:
        """The members of the task's process group, dumped on its host over the agent's connection."""
        if self.poll() is not None:
            return py_spy.Answer(None, problem="the task has ended")
        nonce = py_spy.new_nonce()
        python = task.argv[0] if task.argv else ""
        if task.workdir and not python.startswith("/"):
            python = f"{task.workdir.rstrip('/')}/{python}"
        command = py_spy.script(py_spy.listing_of_group(self.pid), native, [python], nonce, py_spy.configured())
        try:
            _, out, _ = self._agent.conn.run(command, timeout, limit=py_spy.MAX_PROCESSES * (py_spy.DUMP_LIMIT + 4096))
        except MgpuError as e:
            return py_spy.Answer(None, problem=str(e))
        return py_spy.parse_answer(out, nonce)

    def signal_tree(self, signum: int) -> None:
        if self.poll() is None:
            self._agent.send(wire.SIGNAL, self._ident, str(int(signum)).encode())

    def close(self) -> None:
        """The task's end, as its session's would be: the agent's guard ends what is left of it."""
        if self._closed:
            return
        self._closed = True
        self._agent.send(wire.CLOSE, self._ident)
        for inbox in self._inboxes.values():
            inbox.end()
        self._agent.forget(self._ident)


class HostAgents:
    """The run's agents, one per host (its SSH target), each started at the host's first task: in
    the session its checks handed over, or in a session of its own; one whose session has ended is
    started again (a login only if the connection is gone too)."""

    def __init__(self, backend):
        self._backend = backend  # the SshBackend: its targets, connections, handovers and settings
        self._lock = threading.Lock()
        self._locks: dict = {}
        self._agents: dict = {}

    def start(self, task: TaskPlan, attempt: int) -> AgentTaskProcess:
        backend = self._backend
        target = backend.target(task)
        with self._lock:
            lock = self._locks.setdefault(target, threading.Lock())
        with lock:
            agent = self._agents.get(target)
            if agent is None or not agent.alive:
                # Whichever of the host's tasks comes first starts the agent in its checks' session.
                handovers = backend.handovers_to(target)
                for unused in handovers[1:]:
                    unused.close()
                agent = self._begin(task, handovers[0] if handovers else None)
                self._agents[target] = agent
        return agent.start_task(task, backend.task_env(task, attempt), backend.grace_period)

    def _begin(self, task: TaskPlan, handover) -> HostAgent:
        options = self._backend.options
        wait = max(options.connect_timeout, _SHELL_START_TIMEOUT)
        if handover is not None:
            try:
                return HostAgent.start(handover.connection, handover.channel, options.connect_timeout, wait)
            except ConnectError:
                handover.connection.release()  # its shell ended before it started the agent: a session of its own
        conn = self._backend.connect(task)
        try:
            return HostAgent.start(conn, None, options.connect_timeout, wait)
        except BaseException:
            conn.release()
            raise

    def close(self) -> None:
        with self._lock:
            agents, self._agents = list(self._agents.values()), {}
        for agent in agents:
            agent.close()
