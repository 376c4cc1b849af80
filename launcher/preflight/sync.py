"""Copying the `--sync` folder to every remote host before anything starts, over the run's own SSH
connections (SFTP), every host at once.

Each host keeps, in its copy, a manifest of what it holds (config.sync.MANIFEST_NAME: each file's
hash and mode): a file is sent only when its hash differs, a mode fixed in place, a file the folder
no longer has removed; files the manifest does not list (a run's outputs) are left alone. A file
goes as one tar stream that the host's tar unpacks (SFTP, a file at a time, where the host has
no tar), and the manifest is written last, so a sync cut short is finished by the next one. What
is sent is hashed again as it is read: a file that changed since the plan was made fails the sync
rather than giving the hosts other files than the digest names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import shlex
import stat
import sys
import tarfile
import threading
import time
from typing import Sequence, TextIO

import paramiko

from launcher.config.sync import MANIFEST_NAME, SyncedFile, SyncedFolder, human_bytes
from launcher.errors import CheckFailed
from launcher.plan.planner import TaskPlan
from launcher.preflight.on_host import by_host, in_parallel
from launcher.shell import sh

COMMAND_TIMEOUT = 60.0
CHANNELS_PER_HOST = 4  # SFTP sessions copying at once on one host's connection (sshd allows 10)
PARALLEL_HOSTS = 32
_CHUNK = 256 * 1024
_LOGIN_LINES = 1000
_PART = ".mgpu-part"  # the suffix of a file being written
PROGRESS_FROM_BYTES = 16 << 20  # a bar only for copies this large
_WINDOW = 8 << 20


@dataclasses.dataclass(frozen=True)
class HostSync:
    host: str
    folder: str  # the copy's absolute path on the host
    copied: int
    copied_bytes: int
    removed: int
    unchanged: int

    def describe(self) -> str:
        return (f"{self.host}:{self.folder}: {self.copied} file(s) copied ({human_bytes(self.copied_bytes)}), "
                f"{self.removed} removed, {self.unchanged} unchanged")


def sync_to_hosts(plans: Sequence[TaskPlan], ssh_backend, err: TextIO = sys.stderr) -> list[HostSync]:
    """Copy the plans' synced folder to the host of every remote plan; CheckFailed naming the host
    when one cannot take it. Prints one line per host."""
    remote = [group[0] for group in by_host(p for p in plans if not p.local and p.sync is not None)]
    if not remote:
        return []
    folder = remote[0].sync
    started = time.monotonic()
    progress = _Progress(err)
    try:
        results = in_parallel([lambda plan=plan: _sync_host(plan, folder, ssh_backend, progress) for plan in remote],
                              PARALLEL_HOSTS)
    finally:
        progress.close()
    for result in results:
        print(f"mgpu: sync {result.describe()}", file=err, flush=True)
    print(f"mgpu: synced {folder.source} to {len(results)} host(s) in {time.monotonic() - started:.1f} s "
          f"(digest {folder.digest[:16]})", file=err, flush=True)
    return results


def _sync_host(plan: TaskPlan, folder: SyncedFolder, ssh_backend, progress: "_Progress") -> HostSync:
    conn = ssh_backend.connect(plan, CHANNELS_PER_HOST + 1)
    clients: list[paramiko.SFTPClient] = []
    try:
        root = plan.workdir
        try:
            clients.append(_sftp(conn))
            root = _make_folder(clients[0], plan)
            held = _read_manifest(clients[0], root)
            files = {f.path: f for f in folder.files}
            to_copy = [f for f in folder.files if held.get(f.path, {}).get("sha256") != f.sha256
                       or bool(held.get(f.path, {}).get("link")) != bool(f.link)]
            copying = {f.path for f in to_copy}
            to_chmod = [f for f in folder.files
                        if f.path not in copying and held[f.path].get("mode") != f.mode and not f.link]
            to_remove = sorted(path for path in held if path not in files)
            progress.expect(sum(f.size for f in to_copy))
            # Removed first: a path may change from a link or a file into a folder, or back.
            _remove(clients[0], root, to_remove)
            for f in to_chmod:
                clients[0].chmod(f"{root}/{f.path}", f.mode)
            if to_copy and not _send_tar(conn, root, folder.source, to_copy, progress):
                kept = [path for path in held if path in files]  # their folders are there
                _make_parents(clients[0], root, [f.path for f in to_copy], kept)
                while len(clients) < min(CHANNELS_PER_HOST, len(to_copy)):
                    clients.append(_sftp(conn))
                shares = [to_copy[i::len(clients)] for i in range(len(clients))]
                in_parallel([lambda c=c, share=share: [_put(c, root, folder.source, f, progress, f.path in held)
                                                       for f in share]
                             for c, share in zip(clients, shares)], len(clients))
            _write_manifest(clients[0], root, folder)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise CheckFailed(f"sync to {plan.host}:{root} failed: {_describe(e)}") from e
        return HostSync(plan.host, root, len(to_copy), sum(f.size for f in to_copy), len(to_remove),
                        len(folder.files) - len(to_copy))
    finally:
        for client in clients:
            client.close()
        conn.release(CHANNELS_PER_HOST + 1)


# Where OpenSSH installs its SFTP server: started by hand where sshd offers no `sftp` subsystem.
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server",
                "/usr/libexec/sftp-server")


def _sftp(conn) -> paramiko.SFTPClient:
    """An SFTP session on the host's connection: sshd's `sftp` subsystem, or else OpenSSH's
    sftp-server run as a command (a host whose sshd_config names no subsystem)."""
    chan = conn.open_session(COMMAND_TIMEOUT)
    try:
        chan.invoke_subsystem("sftp")
        return paramiko.SFTPClient(chan)
    except (paramiko.SSHException, EOFError):
        chan.close()
    chan = conn.open_session(COMMAND_TIMEOUT)
    script = "; ".join(f"[ -x {path} ] && exec {path}" for path in SFTP_SERVERS) + "; exit 127"
    try:
        chan.exec_command(sh(script))
        return paramiko.SFTPClient(chan)
    except (paramiko.SSHException, EOFError) as e:
        chan.close()
        raise CheckFailed(f"sync to {conn.target.label}: the host offers no SFTP (no `Subsystem sftp` in its "
                          f"sshd_config, no sftp-server in {', '.join(SFTP_SERVERS)})") from e


def _describe(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _make_folder(sftp: paramiko.SFTPClient, plan: TaskPlan) -> str:
    """Make the workdir on the host (a relative one under the login directory, where SFTP starts);
    its absolute path there."""
    folder = plan.workdir if plan.workdir.startswith("/") else posixpath.join(sftp.normalize("."), plan.workdir)
    made = "/"
    for part in folder.strip("/").split("/"):
        made = posixpath.join(made, part)
        try:
            sftp.mkdir(made, 0o755)
        except OSError:
            try:
                is_dir = stat.S_ISDIR(sftp.stat(made).st_mode or 0)
            except OSError as e:
                raise CheckFailed(f"sync to {plan.host}: cannot make the folder {made}: {_describe(e)}") from e
            if not is_dir:
                raise CheckFailed(f"sync to {plan.host}: {made} exists and is not a folder") from None
    return sftp.normalize(folder)


def _read_manifest(sftp: paramiko.SFTPClient, root: str) -> dict[str, dict]:
    """What the host's copy holds, by path; empty when it has no manifest (or one mgpu cannot read)."""
    try:
        with sftp.open(f"{root}/{MANIFEST_NAME}", "rb") as f:
            data = json.loads(f.read())
        held = data["files"]
        return {path: entry for path, entry in held.items() if isinstance(entry, dict)}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def _write_manifest(sftp: paramiko.SFTPClient, root: str, folder: SyncedFolder) -> None:
    files = {f.path: {"sha256": f.sha256, "mode": f.mode, **({"link": f.link} if f.link else {})}
             for f in folder.files}
    text = json.dumps({"source": folder.source, "digest": folder.digest, "files": files}, indent=1)
    path = f"{root}/{MANIFEST_NAME}"
    with sftp.open(path + _PART, "wb") as f:
        f.set_pipelined(True)
        f.write(text.encode("utf-8", "surrogateescape"))
    sftp.posix_rename(path + _PART, path)


def _make_parents(sftp: paramiko.SFTPClient, root: str, paths: Sequence[str], kept: Sequence[str]) -> None:
    """The folders the files to copy go in; those of the files the host keeps exist already."""
    present = {posixpath.dirname(path) for path in kept}
    wanted = {posixpath.dirname(path) for path in paths} - present - {""}
    needed = set()
    for folder in wanted:
        while folder and folder not in present:
            needed.add(folder)
            folder = posixpath.dirname(folder)
    for folder in sorted(needed, key=lambda d: d.count("/")):
        try:
            sftp.mkdir(f"{root}/{folder}", 0o755)
        except OSError:
            if not stat.S_ISDIR(sftp.stat(f"{root}/{folder}").st_mode or 0):
                raise CheckFailed(f"sync: {root}/{folder} exists on the host and is not a folder") from None


def _send_tar(conn, root: str, source: str, files: Sequence[SyncedFile], progress: "_Progress") -> bool:
    """Send `files` as one tar stream that the host's tar unpacks in `root`: one stream, no round
    trip per file. False, having sent nothing, when the host has no tar (then SFTP sends them)."""
    chan = conn.open_session(COMMAND_TIMEOUT)
    try:
        chan.exec_command(sh(f"cd {shlex.quote(root)} || exit 126; command -v tar >/dev/null || exit 127; "
                             f"echo ready; exec tar -x -p --no-same-owner -f -"))
        replies = chan.makefile("rb")
        ready = b""
        for _ in range(_LOGIN_LINES):  # a login script may print before the command runs
            ready = replies.readline()
            if not ready or ready.strip() == b"ready":
                break
        if ready.strip() != b"ready":
            if chan.recv_exit_status() == 127:
                return False
            raise CheckFailed(f"sync to {conn.target.label}: cannot unpack in {root}: "
                              f"{_last_line(chan) or ready.decode('utf-8', 'replace').strip()}")
        with chan.makefile("wb") as stream, tarfile.open(fileobj=stream, mode="w|", bufsize=1 << 20,
                                                         format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                info = tarfile.TarInfo(f.path)
                info.mtime = int(time.time())
                if f.link:
                    info.type, info.linkname = tarfile.SYMTYPE, f.link
                    tar.addfile(info)
                    continue
                info.size, info.mode = f.size, f.mode
                path = os.path.join(source, f.path)
                try:
                    src = open(path, "rb")
                except OSError as e:
                    raise CheckFailed(f"sync: cannot read {path}: {_describe(e)}") from e
                with src:
                    reader = _HashingReader(src, progress)
                    try:
                        tar.addfile(info, reader)
                    except OSError as e:  # shorter than when it was read: it changed
                        raise CheckFailed(f"sync: {path} changed while mgpu was copying it; launch again") from e
                if reader.digest.hexdigest() != f.sha256:
                    raise CheckFailed(f"sync: {path} changed while mgpu was copying it; launch again")
        chan.shutdown_write()
        code = chan.recv_exit_status()
        if code != 0:
            raise CheckFailed(f"sync to {conn.target.label}: tar could not unpack in {root}: "
                              f"{_last_line(chan) or f'exit code {code}'}")
        return True
    finally:
        chan.close()


def _last_line(chan) -> str:
    err = b""
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)
    return (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1]


class _HashingReader:
    """A file as tarfile reads it, hashed and counted on the way."""

    def __init__(self, src, progress: "_Progress"):
        self._src = src
        self._progress = progress
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._src.read(size)
        self.digest.update(data)
        self._progress.add(len(data))
        return data


def _put(sftp: paramiko.SFTPClient, root: str, source: str, f: SyncedFile, progress: "_Progress",
         replaces: bool) -> None:
    """Send one file (or make one link). A file the host holds is written beside it and renamed
    over it; a new one is written in place (the manifest does not list it until it is whole)."""
    remote = f"{root}/{f.path}"
    if f.link:
        try:
            sftp.remove(remote)
        except FileNotFoundError:
            pass
        sftp.symlink(f.link, remote)
        return
    digest = hashlib.sha256()
    try:
        src = open(os.path.join(source, f.path), "rb")
    except OSError as e:
        raise CheckFailed(f"sync: cannot read {os.path.join(source, f.path)}: {_describe(e)}") from e
    part = remote + _PART if replaces else remote
    with src, sftp.open(part, "wb") as dst:
        dst.set_pipelined(True)
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            progress.add(len(chunk))
    if digest.hexdigest() != f.sha256:
        sftp.remove(part)
        raise CheckFailed(f"sync: {os.path.join(source, f.path)} changed while mgpu was copying it; launch again")
    sftp.chmod(part, f.mode)
    if replaces:
        sftp.posix_rename(part, remote)


def _remove(sftp: paramiko.SFTPClient, root: str, paths: Sequence[str]) -> None:
    """Remove files the folder no longer has, then their folders that are left empty."""
    folders = set()
    for path in paths:
        try:
            sftp.remove(f"{root}/{path}")
        except FileNotFoundError:
            pass
        folder = posixpath.dirname(path)
        while folder:
            folders.add(folder)
            folder = posixpath.dirname(folder)
    for folder in sorted(folders, key=lambda d: -d.count("/")):
        try:
            sftp.rmdir(f"{root}/{folder}")
        except OSError:
            pass  # not empty: it holds files of the folder, or of the runs


class _Progress:
    """A bar on a terminal while a large copy runs: bytes sent to every host together."""

    def __init__(self, err: TextIO):
        self._err = err
        self._total = 0
        self._done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def expect(self, size: int) -> None:
        with self._lock:
            self._total += size
            start = self._thread is None and self._total >= PROGRESS_FROM_BYTES and _is_terminal(self._err)
            if start:
                self._thread = threading.Thread(target=self._draw_until_stopped, daemon=True, name="mgpu-sync-bar")
        if start:
            self._thread.start()

    def add(self, size: int) -> None:
        with self._lock:
            self._done += size

    def _draw_until_stopped(self) -> None:
        while not self._stop.wait(0.2):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            done, total = self._done, max(self._total, 1)
        width = 30
        filled = min(width, done * width // total)
        self._err.write(f"\r\x1b[Kmgpu: syncing [{'#' * filled}{' ' * (width - filled)}] "
                        f"{human_bytes(done)} / {human_bytes(total)}")
        self._err.flush()
        self._shown = True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            if self._shown:
                self._err.write("\r\x1b[K")
                self._err.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
