"""mgpu's host agent (`--host-agent`): one per remote host, it starts and keeps all of the host's
tasks, in every attempt, and does for each what its own SSH session did beside it.

Standard library only, importing nothing of mgpu: its source is shipped on the session that runs
it, as the probe's is. Its stdin is the starting shell's environment (`env -0`), descriptor 3 the
launcher's frames, stdout its own frames: the protocol, and what it does for each task, are in
agent.py's docstring, the launcher's end.
"""

import json
import os
import resource
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time

from launcher.backends.ssh.host_agent_proc import by_session, end_task, kill_group, listdir, processes_of
from launcher.backends.ssh.host_agent_proc import read_text, socket_inodes, sockets, uptime_cs

FRAME = struct.Struct("!BII")
START, SIGNAL, CREDIT, CLOSE = b"S"[0], b"K"[0], b"C"[0], b"X"[0]
STARTED, OUT, ERR, EOF, REPORT, EXIT = b"P"[0], b"O"[0], b"E"[0], b"D"[0], b"R"[0], b"Z"[0]
CONTROL_FD = 3
MAX_FRAME = 1 << 26  # the launcher's frames: a task's command line and environment
READ_SIZE = 65536
TICK = 0.1  # seconds between looks for ended tasks
REPORT_EVERY = 0.25  # seconds between the join reporter's looks at the tasks' sockets
USAGE_EVERY = 2.0  # seconds between CPU samples


class Task:
    def __init__(self, ident, spec, proc):
        self.ident = ident
        self.proc = proc
        self.pgid = proc.pid
        self.grace = int(spec.get("grace", 10))
        self.tags = [str(tag) for tag in spec.get("tags", ())]
        self.own = spec.get("own")
        self.coord = spec.get("coord")
        self.pipes = {1: proc.stdout.fileno(), 2: proc.stderr.fileno()}
        window = int(spec.get("window", 65536))
        self.credit = {1: window, 2: window}
        self.registered = set()
        self.status = None
        self.listening = self.connected = False
        self.joined = self.own is None and self.coord is None
        self.stopped = False


class Agent:
    def __init__(self, base_env):
        self.base_env = base_env
        self.tasks = {}
        self.selector = selectors.DefaultSelector()
        self.write_lock = threading.Lock()
        self.guards = []

    # -- frames --------------------------------------------------------------------------------
    def send(self, kind, ident, payload=b""):
        data = FRAME.pack(kind, ident, len(payload)) + payload
        with self.write_lock:
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]

    def run(self):
        self.selector.register(CONTROL_FD, selectors.EVENT_READ, None)
        buffer = bytearray()
        next_report = next_usage = 0.0
        while True:
            for key, _ in self.selector.select(TICK):
                if key.data is None:
                    chunk = os.read(CONTROL_FD, READ_SIZE)
                    if not chunk:
                        self.hang_up()
                        return
                    buffer += chunk
                    while len(buffer) >= FRAME.size:
                        kind, ident, size = FRAME.unpack_from(buffer)
                        if size > MAX_FRAME:
                            self.hang_up()
                            return
                        if len(buffer) < FRAME.size + size:
                            break
                        payload = bytes(buffer[FRAME.size:FRAME.size + size])
                        del buffer[:FRAME.size + size]
                        self.obey(kind, ident, payload)
                else:
                    self.pump(*key.data)
            self.reap()
            now = time.monotonic()
            if now >= next_report:
                next_report = now + REPORT_EVERY
                usage = now >= next_usage
                if usage:
                    next_usage = now + USAGE_EVERY
                self.report(usage)

    def obey(self, kind, ident, payload):
        task = self.tasks.get(ident)
        if kind == START and task is None:
            self.start(ident, payload)
        elif task is None:
            return
        elif kind == SIGNAL and task.status is None:
            self.signal(task, int(payload))
        elif kind == CREDIT and len(payload) == 5:
            stream, more = struct.unpack("!BI", payload)
            if stream in task.credit:
                task.credit[stream] += more
                self.listen(task, stream)
        elif kind == CLOSE:
            self.guard(task)

    # -- tasks ---------------------------------------------------------------------------------
    def start(self, ident, payload):
        try:
            spec = json.loads(payload.decode("utf-8", "surrogateescape"))
            argv = [os.fsencode(arg) for arg in spec["argv"]]
            env = dict(self.base_env)
            env.update({os.fsencode(k): os.fsencode(v) for k, v in spec["env"].items()})
            workdir = spec.get("workdir")
            if workdir:  # as the `cd` of a session's shell leaves them
                env[b"OLDPWD"], env[b"PWD"] = os.getcwdb(), os.fsencode(workdir)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            self.fail(ident, "mgpu host agent: a task it cannot read: %s\n" % e, 255)
            return
        try:
            proc = subprocess.Popen(argv, env=env, cwd=workdir or None, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                    restore_signals=True, close_fds=True)
        except OSError as e:
            # As the shell says it: 2 for a folder `cd` cannot enter, 127 for a program not found, 126
            # for one it cannot run.
            if workdir and e.filename in (workdir, os.fsencode(workdir)):
                what, code = "cd: " + workdir, 2
            else:
                what, code = os.fsdecode(argv[0]), 127 if isinstance(e, FileNotFoundError) else 126
            self.fail(ident, "mgpu host agent: %s: %s\n" % (what, e.strerror or e), code)
            return
        task = Task(ident, spec, proc)
        self.tasks[ident] = task
        self.send(STARTED, ident, str(task.pgid).encode())
        for stream in (1, 2):
            self.listen(task, stream)

    def fail(self, ident, message, code):
        self.send(STARTED, ident, b"0")
        self.send(ERR, ident, message.encode("utf-8", "replace"))
        self.send(EOF, ident, b"1")
        self.send(EOF, ident, b"2")
        self.send(EXIT, ident, str(code).encode())

    def listen(self, task, stream):
        fd = task.pipes.get(stream)
        if fd is not None and task.credit[stream] > 0 and stream not in task.registered:
            self.selector.register(fd, selectors.EVENT_READ, (task, stream))
            task.registered.add(stream)

    def pump(self, task, stream):
        fd = task.pipes[stream]
        try:
            data = os.read(fd, min(task.credit[stream], READ_SIZE))
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(fd)
            task.registered.discard(stream)
            os.close(fd)
            del task.pipes[stream]
            self.send(EOF, task.ident, str(stream).encode())
            return
        task.credit[stream] -= len(data)
        self.send(OUT if stream == 1 else ERR, task.ident, data)
        if task.credit[stream] <= 0:
            self.selector.unregister(fd)
            task.registered.discard(stream)

    def reap(self):
        for task in self.tasks.values():
            if task.status is None and task.proc.poll() is not None:
                task.status = task.proc.returncode
                self.send(EXIT, task.ident, str(task.status).encode())
                self.guard(task)  # what the task left in its group or tagged ends with it, as with a session

    def signal(self, task, signum):
        members = processes_of(lambda fields: fields[2] == str(task.pgid))
        if signum == signal.SIGABRT:
            for pid in members:
                try:
                    resource.prlimit(pid, resource.RLIMIT_CORE, (0, resource.prlimit(pid, resource.RLIMIT_CORE)[1]))
                except (OSError, ValueError):
                    pass
        kill_group(task.pgid, signum)
        if signum == signal.SIGABRT:
            kill_group(task.pgid, signal.SIGCONT)  # a stopped task takes it where it stopped

    def guard(self, task):
        thread = threading.Thread(target=end_task, args=(task.pgid, task.grace, task.tags), daemon=True)
        thread.start()
        self.guards.append(thread)
        self.guards = [thread for thread in self.guards if thread.is_alive()]

    def hang_up(self):
        for task in self.tasks.values():
            self.guard(task)
        deadline = time.monotonic() + max([task.grace for task in self.tasks.values()] + [0]) + 5
        # A task that ended is this agent's child until reaped, and its group stays alive to the
        # guards meanwhile: reaped here, or each guard would wait out the whole grace period.
        while any(thread.is_alive() for thread in self.guards) and time.monotonic() < deadline:
            for task in self.tasks.values():
                task.proc.poll()
            time.sleep(TICK)

    # -- the join reporter ---------------------------------------------------------------------
    def report(self, usage):
        running = [task for task in self.tasks.values() if task.status is None]
        if not running:
            return
        waiting = [task for task in running if not task.joined]
        found = sockets([task for task in waiting]) if waiting else {}
        sessions = None
        if usage or found:
            sessions = by_session()
        for task in waiting:
            wanted = found.get(task.ident)
            if not wanted:
                continue
            held = socket_inodes(sessions.get(str(task.pgid), ()))
            for state, inode in wanted:
                if inode in held:
                    if state == "listening" and not task.listening:
                        task.listening = True
                        self.send(REPORT, task.ident, b"listening")
                    if state == "connected" and not task.connected:
                        task.connected = True
                        self.send(REPORT, task.ident, b"connected")
            task.joined = task.listening or (task.own is None and task.connected)
        if not usage:
            return
        up = uptime_cs()
        for task in running:
            members = sessions.get(str(task.pgid), ())
            used = waited = 0
            stopped = False
            for pid, state in members:
                stopped = stopped or state in ("T", "t")
                for thread in listdir("/proc/%s/task" % pid):
                    fields = read_text("/proc/%s/task/%s/schedstat" % (pid, thread)).split()
                    if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
                        used += int(fields[0])
                        waited += int(fields[1])
            self.send(REPORT, task.ident, ("usage %d %d %d" % (up, used, used + waited)).encode())
            if stopped != task.stopped:
                task.stopped = stopped
                self.send(REPORT, task.ident, b"stopped" if stopped else b"running")


def read_environment():
    """The starting shell's environment, `env -0` on stdin; this process's own when none came."""
    data = bytearray()
    while len(data) < (1 << 24):
        chunk = os.read(0, READ_SIZE)
        if not chunk:
            break
        data += chunk
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    env = {}
    for entry in bytes(data).split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name] = value
    return env or dict(os.environb)


def main():
    env = read_environment()
    nonce = sys.argv[-1] if len(sys.argv) > 1 else ""
    os.write(1, ("mgpu-agent-ready %s\n" % nonce).encode())
    Agent(env).run()


if __name__ == "__main__":
    main()
