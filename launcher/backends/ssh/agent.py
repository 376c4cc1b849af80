"""The launcher's end of the host agents (how SSH tasks start unless `--no-host-agent`): one session
per host runs host_agent.py, which starts every task of the host, in every attempt, and frames their
output back.

A host's agent starts in the session its checks ran in (a handover: handover.py), or without the
checks in a session of its own, at the host's first task; it stays for the run, so a restart starts
its tasks with no new login. Each task is an `AgentTaskProcess` (agent_task.py), which answers as an
`SshTaskProcess` does: its two streams, its status, the join reporter's words, signals to its group,
py-spy on the run's connection.

The agent is sent as source on its session's stdin (`agent_source`: host_agent_proc.py, then
host_agent.py) after a short program that reads it and runs it with the host's python3; before that
program, the session's shell's environment (the login's, before any interpreter shim) goes to its
stdin with `env -0`. Then its descriptor 3 is the session's stdin, the launcher's frames, and its
stdout the session's stdout, its frames. A frame is a header (kind, task id, payload length:
host_agent.FRAME) and its payload. The launcher says START (a task: JSON), SIGNAL (a signal number),
CREDIT (stream 1 or 2 and a byte count) and CLOSE; the agent says STARTED (the task's process group),
OUT and ERR (the task's bytes, as they came), EOF (stream 1 or 2 has ended), REPORT (a line in the
join reporter's words, remote_command.py), and EXIT (the status; -N for signal N).

What a task's own session did beside it, the agent does for every task of the host:
- each task gets its own session and process group (setsid), stdin from /dev/null, and the signal
  dispositions of a fresh program (Python's own ignored signals restored);
- the hang-up guard: when the launcher's stream ends (the launcher, or its connection, gone), when
  the launcher closes a task, and when a task ends, the task's group and the processes of this user
  that carry its tags get SIGTERM, the grace period, then SIGKILL;
- back-pressure: a task's pipe is read only while the launcher has granted the stream credit
  (agent_task.STREAM_WINDOW), so a task that writes faster than the launcher reads waits on its
  host while the others' output passes it by, and a host's agent session holds at most its tasks'
  windows and the channel's own window here;
- the join reporter (LISTENING, CONNECTED), CPU samples (USAGE) and the stopped state (STOPPED,
  RUNNING), in the per-task reporter's words;
- signals to the whole group; before SIGABRT (the request for stacks) the group's core limit is
  set to 0, and after it the group is continued.
"""

from __future__ import annotations

import json
import pathlib
import re
import secrets
import shlex
import socket
import threading
import time

import paramiko

from launcher.backends.ssh import host_agent as wire, host_agent_proc, remote_command
from launcher.backends.ssh.agent_task import STREAM_WINDOW, AgentTaskProcess
from launcher.backends.ssh.connection import Connection
from launcher.backends.ssh.remote_command import RemoteTask
from launcher.errors import ConnectError
from launcher.shell import sh
from launcher.plan.planner import TaskPlan

# host_agent.py's imports of host_agent_proc.py: left out of the one source, which defines those names above.
_SHIPPED_IMPORT = re.compile(r"^from launcher\.backends\.ssh\.host_agent_proc import [\w, ]+\n", re.MULTILINE)
_PREAMBLE_LIMIT = 1 << 20  # what a login shell may print on stdout before the agent's first line
_STDERR_TAIL = 4096  # of the agent's own stderr, kept for the reason it ended
_START_TIMEOUT = 30.0  # seconds for a running agent to start a task
_SHELL_START_TIMEOUT = 60.0  # seconds for a login shell to start the agent (its start-up files run first)

# Reads exactly its source's length from descriptor 3 (the session's stdin) and runs it; the
# environment comes on its stdin, from `env -0` in the starting shell, before any interpreter shim.
_BOOT = ("import os,sys\nn=int(sys.argv[1]);b=bytearray()\nwhile len(b)<n:\n c=os.read(3,n-len(b))\n"
         " if not c:sys.exit(255)\n b+=c\nexec(compile(bytes(b),'mgpu-host-agent','exec'),{'__name__':'__main__'})")


def agent_source() -> bytes:
    """The agent as one source: host_agent_proc.py, then host_agent.py less its imports of it."""
    proc = pathlib.Path(host_agent_proc.__file__).read_text(encoding="utf-8")
    agent = _SHIPPED_IMPORT.sub("", pathlib.Path(wire.__file__).read_text(encoding="utf-8"))
    return (proc + "\n\n" + agent).encode("utf-8")


def agent_command(nonce: str) -> RemoteTask:
    """The command that starts the agent in a session (or a handed-over check's shell), and its
    stdin: the agent's source. The host's python3 runs it."""
    source = agent_source()
    command = (f"exec 3<&0; env -0 2>/dev/null | exec python3 -c {shlex.quote(_BOOT)} {len(source)} {nonce}")
    return RemoteTask(command, source)


class HostAgent:
    """A host's agent: its session, the thread that reads its frames, its tasks."""

    def __init__(self, conn: Connection, chan: paramiko.Channel, answer_timeout: float):
        self.conn = conn
        self.chan = chan
        self.answer_timeout = answer_timeout  # the connect timeout: a keepalive's, asked on a stall
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
            if handed_over:  # the check's shell is /bin/sh already
                chan.sendall(task_line(remote))
            else:  # the login shell (csh or fish too) only execs /bin/sh, which runs it as the check's shell would
                chan.exec_command(sh(remote.command))
                chan.sendall(remote.stdin)
            agent = cls(conn, chan, timeout)
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
        if len(payload) > wire.MAX_FRAME:  # the agent would take it for a broken launcher and end every task
            self.forget(ident)
            raise ConnectError(f"{task.name}: its command line and environment take {len(payload)} bytes; "
                               f"mgpu's host agent takes at most {wire.MAX_FRAME}")
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
            # Whichever of the host's tasks comes first starts the agent in its checks' session; an
            # agent already there (started for the --setup, before the checks) leaves that session unused.
            handovers = backend.handovers_to(target)
            if agent is None or not agent.alive:
                agent = self._begin(task, handovers.pop(0) if handovers else None)
                self._agents[target] = agent
            for unused in handovers:
                unused.close()
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
