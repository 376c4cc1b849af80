"""The claim on a run id across this machine, whatever the log dir.

A run id tags every process of the run, and the end of a run stops every process of this user
that carries it, whatever its log dir. So a run id is claimed on the whole machine: a lock file
per run id (flock) in a folder of this user's (run_id_lock_dir), held from before the check that
no live process carries the id until the run's last sweep is done. The kernel drops it when the
launcher dies, however it dies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import stat
from typing import Iterator

from launcher.errors import UsageError

LOCK_FILE_MODE = 0o600


def run_id_lock_dir() -> str:
    """Where run id locks live: a folder of this user's that every launch of theirs finds. Root's
    is under /run, which only root may write; another user's is in their XDG_RUNTIME_DIR where that
    is set and is a private folder of theirs (a login session's /run/user/<uid>), else in /tmp,
    where another user may have made the folder first (then the claim says whose it is)."""
    euid = os.geteuid()
    if euid == 0 and os.path.isdir("/run"):
        return "/run/mgpu"
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and _private_folder(runtime):
        return os.path.join(runtime, "mgpu")
    return f"/tmp/mgpu-{euid}"


def lock_dirs() -> list[str]:
    """Every folder a launch of this user may have put its run id locks in, whatever this shell's
    environment: the one run_id_lock_dir() picks here, then the others it picks elsewhere (a login
    session's /run/user/<uid>, another shell's XDG_RUNTIME_DIR, /tmp). For a run without a record of
    its lock's folder."""
    euid = os.geteuid()
    found = [run_id_lock_dir(), f"/run/user/{euid}/mgpu", f"/tmp/mgpu-{euid}"]
    return list(dict.fromkeys(found))


def _private_folder(path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


_claims: dict[str, tuple[int, str]] = {}  # run id -> the descriptor of its locked file and its folder, in this process


def _refusal(path: str, st: os.stat_result) -> UsageError:
    where = f"{path}: owned by {owner_name(st.st_uid)}"
    if st.st_uid != os.geteuid():
        return UsageError(f"{where}, not by you; mgpu keeps its run id locks there. Ask {owner_name(st.st_uid)} or "
                          f"an administrator to remove it, or set XDG_RUNTIME_DIR to a folder of yours that only "
                          f"you can open (mode 0700)")
    return UsageError(f"{path}: open to others (mode {stat.S_IMODE(st.st_mode):04o}); mgpu keeps its run id locks "
                      f"there: make it private (chmod 700 {path}) or remove it")


def _open_lock_dir(path: str) -> int:
    """The lock folder, made if missing (mode 0700); refused unless it is this user's own and private."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e} (mgpu keeps its run id locks there)") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        try:  # another user's folder, which this user may not even open
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and (st.st_uid != os.geteuid() or st.st_mode & 0o077):
            raise _refusal(path, st) from None
        raise UsageError(f"{path}: {e.strerror or e} (mgpu keeps its run id locks there)") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise _refusal(path, st)
    return fd


def claim_run_id(run_id: str) -> None:
    """Lock the run id on this machine (a second claim in this process is a no-op). Raises
    UsageError naming the launch that holds it."""
    if run_id in _claims:
        return
    name = f"{run_id}.lock"
    folder = run_id_lock_dir()
    dir_fd = _open_lock_dir(folder)
    try:
        for _ in range(100):  # a holder that ends removes its file: lock the one now at the name
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_FILE_MODE, dir_fd=dir_fd)
            except OSError as e:  # a full disk, no inodes left, a folder made read-only
                raise _cannot_lock(folder, run_id, e) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                os.close(fd)
                raise _in_use(run_id, holder) from None
            try:
                current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                if os.pwrite(fd, f"{os.getpid()}\n".encode(), 0) == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as e:  # no room for the pid: the claim is given up, its file removed
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
                os.close(fd)
                raise _cannot_lock(folder, run_id, e) from None
            # A launch from a shell with another XDG_RUNTIME_DIR locks in another folder: looked for
            # there too, after this claim, so that of two at once at least one sees the other.
            other = next((pid for place in lock_dirs() if place != folder
                          for pid in [_holder_in(run_id, place)] if pid is not None), None)
            if other is not None:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
                os.close(fd)
                raise _in_use(run_id, str(other))
            _claims[run_id] = fd, folder
            return
        raise UsageError(f"run id {run_id}: its lock in {folder} keeps changing; choose another run id")
    finally:
        os.close(dir_fd)


def _in_use(run_id: str, holder: str) -> UsageError:
    return UsageError(f"run id {run_id} is in use by running processes (pid {holder}: a launch on this machine, in "
                      f"any log dir); choose another run id")


def _cannot_lock(folder: str, run_id: str, error: OSError) -> UsageError:
    return UsageError(f"{folder}: cannot lock run id {run_id} there: {error.strerror or error} (mgpu keeps its "
                      f"run id locks there: make room on its disk)")


def release_run_id(run_id: str) -> None:
    """Give the claim up. The file is removed while still locked: a launch that opened it meanwhile
    finds, once it has the lock, that the name is gone or names a new file, and starts over."""
    claim = _claims.pop(run_id, None)
    if claim is None:
        return
    fd, folder = claim
    try:
        os.unlink(os.path.join(folder, f"{run_id}.lock"))
    except OSError:
        pass
    finally:
        os.close(fd)
    if not _claims:  # the run is over: the ports this launcher claimed for its tasks go with it
        release_ports()


def claim_folder(run_id: str) -> str | None:
    """The folder of this process's claim on the run id (where others find its lock), if it holds one."""
    claim = _claims.get(run_id)
    return None if claim is None else claim[1]


def is_claimed(run_id: str) -> bool:
    """Whether this process holds the run id's claim."""
    return run_id in _claims


@contextlib.contextmanager
def claimed(run_id: str) -> Iterator[None]:
    """The run id claimed for the block: by it, or already by this process (then kept after it)."""
    held = is_claimed(run_id)
    claim_run_id(run_id)
    try:
        yield
    finally:
        if not held:
            release_run_id(run_id)


def owner_name(uid: int) -> str:
    """A file's owner, for messages: the user's name and uid, or the uid alone."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def holder(run_id: str, folder: str | None = None) -> int | None:
    """The pid written in the run id's lock while a launch of this user holds it, looked for in
    `folder` (the one the run recorded), else in every folder of lock_dirs(); None when no launch of
    this user holds it. A folder is believed only if it is this user's own and private (another
    user's runs have their locks in their own folder)."""
    for place in [folder] if folder is not None else lock_dirs():
        pid = _holder_in(run_id, place)
        if pid is not None:
            return pid
    return None


def _holder_in(run_id: str, folder: str) -> int | None:
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in a recorded path
        return None
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        try:
            fd = os.open(f"{run_id}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return None
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() and len(text) < 10 else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


_port_claims: dict[int, tuple[int, str]] = {}  # port -> the descriptor of its locked file and its folder
_swept: list[str] = []  # the lock folders this process has swept of stale port locks
MAX_SWEPT = 4096  # port lock files looked at in one sweep


def claim_port(port: int) -> bool:
    """Claim a port for this machine's tasks of this launcher, as long as it lives (host.ports'
    pick_free_ports takes it): a lock file per port beside the run ids' (port:N.lock, a name no
    run id has). False when another live launch of this user holds it, or this one already does.
    The kernel drops the claim when the launcher ends, however it ends; the file goes when the
    run's claim on its run id is given up (release_run_id), or else with the next launch's sweep.
    False too when the claim cannot be made (the lock file cannot be opened or made): a port no
    launch could claim is never handed out as if it were claimed; pick_free_ports then tries others,
    and without any leaves the choice to the kernel."""
    if port in _port_claims:
        return False
    folder = run_id_lock_dir()
    try:
        dir_fd = _open_lock_dir(folder)
    except UsageError:  # the run id's claim, which needs the folder too, says what is wrong with it
        return False
    try:
        if folder not in _swept:
            _swept.append(folder)
            _sweep_ports(dir_fd)
        name = f"port:{int(port)}.lock"
        for _ in range(100):  # a holder or a sweep that removes the file meanwhile: lock the one now at the name
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_FILE_MODE, dir_fd=dir_fd)
            except OSError:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            if _still_named(dir_fd, name, fd):
                _port_claims[port] = fd, folder
                return True
            os.close(fd)
        return False
    finally:
        os.close(dir_fd)


def _still_named(dir_fd: int, name: str, fd: int) -> bool:
    """Whether `name` in the folder is still the file open as `fd` (not removed, not replaced)."""
    try:
        current = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)


def _sweep_ports(dir_fd: int) -> None:
    """Remove the port locks no live launch holds (left by launches that ended before their run
    began, or were killed). Each is removed only while this process holds its lock, so a launch
    that opened it meanwhile finds, once it has the lock, that the name is gone, and starts over."""
    try:
        with os.scandir(dir_fd) as entries:
            names = [entry.name for _, entry in zip(range(MAX_SWEPT), entries)]
    except OSError:
        return
    for name in names:
        if not (name.startswith("port:") and name.endswith(".lock")):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if stat.S_ISREG(os.fstat(fd).st_mode) and _still_named(dir_fd, name, fd):
                os.unlink(name, dir_fd=dir_fd)
        except OSError:  # held by a live launch (BlockingIOError), or gone
            pass
        finally:
            os.close(fd)


def release_ports() -> None:
    """Give up this process's port claims, removing their files while still locked."""
    while _port_claims:
        port, (fd, folder) = _port_claims.popitem()
        try:
            os.unlink(os.path.join(folder, f"port:{port}.lock"))
        except OSError:
            pass
        finally:
            os.close(fd)
