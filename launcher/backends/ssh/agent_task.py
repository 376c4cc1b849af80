"""A task that its host's agent started (agent.py): `AgentTaskProcess`, which answers
as an SshTaskProcess does, from the agent's frames about it; and each of its streams' inbox, which
gives the agent credit back as the stream is read."""

from __future__ import annotations

import struct
import threading
from typing import Any, Protocol

from launcher.backends.base import CpuUsage, TaskProcess
from launcher.backends.ssh import host_agent as wire, remote_command
from launcher.backends.ssh.connection import EXIT_CONNECTION_LOST
from launcher.backends.ssh.on_task_host import OnTaskHost
from launcher.backends.ssh.stream import ChannelStream
from launcher.plan.planner import TaskPlan


class HostAgent(Protocol):
    """What a task asks of its host's agent (agent.HostAgent)."""
    conn: Any  # the host's Connection
    answer_timeout: float  # how long the host has to answer a keepalive (the connect timeout)
    problem: str | None
    alive: bool

    def send(self, kind: int, ident: int, payload: bytes = b"") -> bool: ...

    def forget(self, ident: int) -> None: ...

STREAM_WINDOW = 64 * 1024  # bytes of a task's stdout, and of its stderr, the launcher may hold unread
_CREDIT_AT = STREAM_WINDOW // 4  # bytes read before the credit is given back


class _Inbox:
    """One stream of a task as the agent's frames bring it: `recv` for ChannelStream, which gives
    credit back to the agent as it is read."""

    def __init__(self, agent: HostAgent, ident: int, stream: int):
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


class AgentTaskProcess(OnTaskHost, TaskProcess):
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

    @property
    def _conn(self):  # what OnTaskHost runs its commands on: the agent's connection
        return self._agent.conn

    @property
    def answer_timeout(self) -> float:
        return self._agent.answer_timeout

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
