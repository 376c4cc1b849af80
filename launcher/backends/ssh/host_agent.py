"""mgpu's host agent: the one program per remote host that starts and keeps all of the host's tasks.

Standard library only, and it imports nothing of mgpu: its source is shipped to the host on the
session that starts it (agent.py's `agent_command`), as the probe's is, and runs with the host's
python3. With `--host-agent`, the session that ran a host's checks goes on to run it (or, without
the checks, a session of its own), and every task of the host, in every attempt, is started by it:
one login per host for the whole run.

Its stdin is the environment of the shell that started it (`env -0`, the login's environment, read
to its end): each task starts with it and the task's own variables, as a session of its own would.
Its descriptor 3 is the session's stdin, the launcher's frames; its stdout the session's stdout,
its frames to the launcher. A frame is a header (kind, task id, payload length: FRAME) and its
payload. The launcher says START (a task: JSON), SIGNAL (a signal number), CREDIT (stream 1 or 2 and
a byte count) and CLOSE; the agent says STARTED (the task's process group), OUT and ERR (the task's
bytes, as they came), EOF (stream 1 or 2 has ended), REPORT (a line of the join reporter's words,
remote_command.py), and EXIT (the status; -N for signal N).

What a task's session did beside it, the agent does for every task of the host:
- each task gets its own session and process group (setsid), stdin from /dev/null, and the signal
  dispositions of a fresh program (Python's own ignored signals restored);
- the hang-up guard: when the launcher's stream ends (the launcher, or its connection, gone), when
  the launcher closes a task, and when a task ends, the task's group and the processes of this user
  that carry its tags get SIGTERM, the grace period, then SIGKILL;
- back-pressure: a task's pipe is read only while the launcher has granted the stream credit (its
  window), so a flooding task waits on its own host, and what the launcher holds unread is bounded;
- the join reporter (LISTENING, CONNECTED), CPU samples (USAGE) and the stopped state (STOPPED,
  RUNNING), in the same words as the per-task reporter;
- signals: to the whole group; before SIGABRT (the request for stacks) the group's core limit is
  set to 0, and after it the group is continued.
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

FRAME = struct.Struct("!BII")
START, SIGNAL, CREDIT, CLOSE = b"S"[0], b"K"[0], b"C"[0], b"X"[0]
STARTED, OUT, ERR, EOF, REPORT, EXIT = b"P"[0], b"O"[0], b"E"[0], b"D"[0], b"R"[0], b"Z"[0]
CONTROL_FD = 3
MAX_FRAME = 1 << 20  # the launcher's frames: a task's command line and environment
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
        for thread in list(self.guards):
            thread.join(max(0.0, deadline - time.monotonic()))

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


def read_text(path, limit=65536):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("ascii", "replace")
    except OSError:
        return ""


def listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def processes_of(keep):
    """The pids whose /proc stat fields (after the command's name) `keep` keeps."""
    pids = []
    for name in listdir("/proc"):
        if name.isdigit():
            fields = read_text("/proc/%s/stat" % name).rpartition(")")[2].split()
            if len(fields) > 3 and keep(fields):
                pids.append(int(name))
    return pids


def by_session():
    """{session id: [(pid, state)]} of every process."""
    sessions = {}
    for name in listdir("/proc"):
        if name.isdigit():
            fields = read_text("/proc/%s/stat" % name).rpartition(")")[2].split()
            if len(fields) > 3:
                sessions.setdefault(fields[3], []).append((name, fields[0]))
    return sessions


def sockets(tasks):
    """{task id: [("listening" | "connected", socket inode)]}: sockets on a task's own port that
    listen, and those connected to its coordinator's port, whoever holds them."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in read_text(table, 1 << 24).splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            for task in tasks:
                if task.own is not None and state == "0A" and local.endswith(":%04X" % task.own):
                    found.setdefault(task.ident, []).append(("listening", inode))
                if task.coord is not None and state == "01" and remote.endswith(":%04X" % task.coord):
                    found.setdefault(task.ident, []).append(("connected", inode))
    return found


def socket_inodes(members):
    held = set()
    for pid, _ in members:
        for fd in listdir("/proc/%s/fd" % pid):
            try:
                link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
            except OSError:
                continue
            if link.startswith("socket:["):
                held.add(link[8:-1])
    return held


def uptime_cs():
    first = read_text("/proc/uptime").split()
    try:
        return int(round(float(first[0]) * 100))
    except (IndexError, ValueError):
        return 0


def kill_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass


def tagged(tags):
    """This user's processes whose environment carries every one of `tags` (none without tags)."""
    if not tags:
        return []
    wanted = [tag.encode("utf-8", "surrogateescape") for tag in tags]
    me, found = os.getuid(), []
    for name in listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != me:
                continue
            with open("/proc/%s/environ" % name, "rb") as f:
                environ = set(f.read(1 << 20).split(b"\0"))
        except OSError:
            continue
        if all(tag in environ for tag in wanted):
            found.append(int(name))
    return found


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def end_task(pgid, grace, tags):
    """The hang-up guard: TERM to the task's group and its tagged processes, the grace period, KILL."""
    kill_group(pgid, signal.SIGTERM)
    for pid in tagged(tags):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (group_alive(pgid) or tagged(tags)):
        time.sleep(0.2)
    for pid in tagged(tags):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    kill_group(pgid, signal.SIGKILL)


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
