"""Whether the kernel's OOM killer acted in a process's memory cgroup: the evidence for "killed by
SIGKILL" being out of memory, read on this machine. A process's memory cgroup is found from
/proc/PID/cgroup (cgroup v2's unified line, or v1's memory controller) and where that hierarchy is
mounted (/proc/self/mountinfo: a container sees its own cgroup as the mount's root); its OOM kills
are counted by the kernel in memory.events (v2) or memory.oom_control (v1), as "oom_kill N".
Everything read is bounded and checked; a question that cannot be answered is None."""

from __future__ import annotations

import dataclasses
import os

_MAX_READ = 64 * 1024


@dataclasses.dataclass(frozen=True)
class MemoryCgroup:
    folder: str  # where its files are on this machine
    name: str  # its path in the hierarchy, as /proc/PID/cgroup says it

    def oom_kills(self) -> int | None:
        """The kernel's count of processes its OOM killer ended in this cgroup (and below it)."""
        for file in ("memory.events", "memory.oom_control"):
            text = _read(os.path.join(self.folder, file))
            if text is None:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit() and len(value.strip()) < 20:
                    return int(value)
        return None


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, _MAX_READ).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def memory_cgroup(pid: int, proc: str = "/proc") -> MemoryCgroup | None:
    """The memory cgroup of process `pid` on this machine, or None where it cannot be told."""
    text = _read(f"{proc}/{int(pid)}/cgroup")
    mounts = _read(f"{proc}/self/mountinfo")
    if text is None or mounts is None:
        return None
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    for name, wanted in ((v1, "v1"), (v2, "v2")):
        if name is None:
            continue
        folder = _folder(mounts, name, wanted)
        if folder is not None:
            return MemoryCgroup(folder, name)
    return None


def _folder(mountinfo: str, name: str, version: str) -> str | None:
    """Where cgroup `name` is on this machine: under the mount of its hierarchy whose root holds it."""
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 10:
            continue
        after = line.split(" - ", 1)[1].split(" ")
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        if (version == "v2" and fstype != "cgroup2") or (version == "v1" and (fstype != "cgroup"
                                                                              or "memory" not in options)):
            continue
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if root == "/" or name == root or name.startswith(root.rstrip("/") + "/"):
            relative = name[len(root.rstrip("/")):] if root != "/" else name
            folder = os.path.normpath(mount_point + "/" + relative.lstrip("/"))
            if os.path.isdir(folder):
                return folder
    return None


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (\\040 for a space)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
