"""What the host agent (host_agent.py) reads of its host's /proc, and its hang-up guard: shipped
before it as one source (agent.py's `agent_source`), standard library only."""

import os
import signal
import time


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
    """The hang-up guard: TERM to the task's group and its tagged processes (and CONT, so that a
    stopped one takes it now), the grace period, KILL."""
    for signum in (signal.SIGTERM, signal.SIGCONT):
        kill_group(pgid, signum)
        for pid in tagged(tags):
            try:
                os.kill(pid, signum)
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
