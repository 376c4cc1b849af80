"""Copying the `--sync` folder to every remote host before anything starts, over the run's own SSH
connections (SFTP), every host at once.

The folder on the host must be the account's own and writable by no one else, and so must what
leads to it (remote_tree.py: another user of the host must not be able to put a program there).
Each host keeps, in its copy, a manifest of what it holds (config.sync.MANIFEST_NAME: each file's
hash and mode, and the size and modification time mgpu left it with): a file is sent only when its
hash differs or the host's file is no longer the one mgpu left, a mode fixed in place, a file the
folder no longer has removed; files the manifest does not list (a run's outputs) are left alone.
Nothing is written, changed or removed through a link. A file goes as one tar stream that the
host's tar unpacks (SFTP, a file at a time, where the host has no tar), and the manifest is
written last, so a sync cut short is finished by the next one. What is sent is hashed again as it
is read: a file that changed since the plan was made fails the sync rather than giving the hosts
other files than the digest names. Every read from the host is bounded in size and time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import shlex
import sys
import tarfile
import time
from typing import Sequence, TextIO

import paramiko

from launcher.config.sync import MANIFEST_NAME, SyncedFile, SyncedFolder, human_bytes
from launcher.errors import CheckFailed
from launcher.plan.planner import TaskPlan
from launcher.preflight.on_host import by_host, in_parallel
from launcher.fleet.remote_tree import (Entry, account_uid, clear_places, entry_of, make_parents, own_folder,
                                        plain_relative, remove_gone, scan, shown)
from launcher.fleet.sync_progress import SyncProgress
from launcher.shell import sh

COMMAND_TIMEOUT = 60.0  # for any one answer from the host
CHANNELS_PER_HOST = 4  # SFTP sessions copying at once on one host's connection (sshd allows 10)
PARALLEL_HOSTS = 32
MAX_MANIFEST_BYTES = 64 << 20  # about 300,000 files' entries
_CHUNK = 256 * 1024
_LOGIN_LINES = 1000
_LOGIN_LINE_BYTES = 4096
_PART = ".mgpu-part"  # the suffix of a file being written
_WINDOW = 8 << 20


@dataclasses.dataclass(frozen=True)
class HostSync:
    host: str
    folder: str  # the copy's absolute path on the host
    copied: int
    copied_bytes: int
    removed: int
    unchanged: int
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        return (f"{self.host}:{shown(self.folder)}: {self.copied} file(s) copied "
                f"({human_bytes(self.copied_bytes)}), {self.removed} removed, {self.unchanged} unchanged")


def sync_to_hosts(plans: Sequence[TaskPlan], ssh_backend, err: TextIO = sys.stderr) -> list[HostSync]:
    """Copy the plans' synced folder to the host of every remote plan; CheckFailed naming the host
    when one cannot take it. Prints one line per host."""
    remote = [group[0] for group in by_host(p for p in plans if not p.local and p.sync is not None)]
    if not remote:
        return []
    folder = remote[0].sync
    started = time.monotonic()
    progress = SyncProgress(err)
    try:
        results = in_parallel([lambda plan=plan: _sync_host(plan, folder, ssh_backend, progress) for plan in remote],
                              PARALLEL_HOSTS)
    finally:
        progress.close()
    for result in results:
        for warning in result.warnings:
            print(f"mgpu: warning: sync to {result.host}: {warning}", file=err, flush=True)
        print(f"mgpu: sync {result.describe()}", file=err, flush=True)
    print(f"mgpu: synced {folder.source} to {len(results)} host(s) in {time.monotonic() - started:.1f} s "
          f"(digest {folder.digest[:16]})", file=err, flush=True)
    return results


def _sync_host(plan: TaskPlan, folder: SyncedFolder, ssh_backend, progress: SyncProgress) -> HostSync:
    conn = ssh_backend.connect(plan, CHANNELS_PER_HOST + 2)
    clients: list[paramiko.SFTPClient] = []
    root = plan.workdir
    try:
        try:
            uid = account_uid(conn, plan.host, COMMAND_TIMEOUT)
            clients.append(_sftp(conn))
            sftp = clients[0]
            root = own_folder(sftp, plan.host, _absolute(sftp, plan.workdir), uid)
            held, warnings = _read_manifest(sftp, root, uid)
            files = {f.path: f for f in folder.files}
            tree = scan(sftp, plan.host, root, [*files, *held], uid)
            to_copy = [f for f in folder.files if not _holds(sftp, root, tree.get(f.path), held.get(f.path), f, uid)]
            copying = {f.path for f in to_copy}
            to_chmod = [f for f in folder.files if f.path not in copying and not f.link
                        and tree[f.path].mode & 0o7777 != f.mode]
            to_remove = sorted(path for path in held if path not in files)
            progress.expect(sum(f.size for f in to_copy))
            # Removed first: a path may change from a link or a file into a folder, or back.
            warnings += remove_gone(sftp, root, tree, to_remove)
            clear_places(sftp, plan.host, root, tree, [f.path for f in to_copy])
            for f in to_chmod:  # a regular file of the account's own folder, as lstat found it
                sftp.chmod(f"{root}/{f.path}", f.mode)
            make_parents(sftp, plan.host, root, tree, [f.path for f in to_copy], uid)
            mtime = int(time.time())
            if to_copy and not _send_tar(conn, root, folder.source, to_copy, progress, mtime):
                while len(clients) < min(CHANNELS_PER_HOST, len(to_copy)):
                    clients.append(_sftp(conn))
                shares = [to_copy[i::len(clients)] for i in range(len(clients))]
                in_parallel([lambda c=c, share=share: [_put(c, root, folder.source, f, progress, mtime)
                                                       for f in share]
                             for c, share in zip(clients, shares)], len(clients))
            # What each file was left with: as before where it was held, this copy's time where it was sent.
            mtimes = {path: entry.get("mtime") for path, entry in held.items()} | dict.fromkeys(copying, mtime)
            _write_manifest(sftp, root, folder, mtimes)
        except (OSError, EOFError, paramiko.SSHException, UnicodeError) as e:
            raise CheckFailed(f"sync to {plan.host}:{shown(root)} failed: {_describe(e)}") from e
        return HostSync(plan.host, root, len(to_copy), sum(f.size for f in to_copy), len(to_remove),
                        len(folder.files) - len(to_copy), tuple(warnings))
    finally:
        for client in clients:
            client.close()
        conn.release(CHANNELS_PER_HOST + 2)


def _absolute(sftp: paramiko.SFTPClient, workdir: str) -> str:
    """The workdir as an absolute path: a relative one is under the login directory, where SFTP starts."""
    return workdir if workdir.startswith("/") else posixpath.join(sftp.normalize("."), workdir)


def _holds(sftp: paramiko.SFTPClient, root: str, entry: Entry | None, held: dict | None, f: SyncedFile,
           uid: int) -> bool:
    """Whether the host's copy holds `f` as it is here: the manifest says it sent this content,
    and the file is still the one it left (type, owner, size, modification time), or the link
    still points where it did."""
    if entry is None or held is None or held.get("sha256") != f.sha256 or bool(held.get("link")) != bool(f.link):
        return False
    if entry.uid not in (uid, 0):
        return False
    if f.link:
        return entry.is_link and sftp.readlink(f"{root}/{f.path}") == f.link
    return entry.is_file and entry.size == f.size and held.get("mtime") == entry.mtime


# Where OpenSSH installs its SFTP server: started by hand where sshd offers no `sftp` subsystem.
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/lib/ssh/sftp-server",
                "/usr/libexec/sftp-server")


def _sftp(conn) -> paramiko.SFTPClient:
    """An SFTP session on the host's connection: sshd's `sftp` subsystem, or else OpenSSH's
    sftp-server run as a command (a host whose sshd_config names no subsystem)."""
    chan = conn.open_session(COMMAND_TIMEOUT)
    try:
        chan.settimeout(COMMAND_TIMEOUT)  # every answer bounded in time: a host that stops answering fails the sync
        chan.invoke_subsystem("sftp")
        return paramiko.SFTPClient(chan)
    except (paramiko.SSHException, EOFError):
        chan.close()
    chan = conn.open_session(COMMAND_TIMEOUT)
    script = "; ".join(f"[ -x {path} ] && exec {path}" for path in SFTP_SERVERS) + "; exit 127"
    try:
        chan.settimeout(COMMAND_TIMEOUT)
        chan.exec_command(sh(script))
        return paramiko.SFTPClient(chan)
    except (paramiko.SSHException, EOFError) as e:
        chan.close()
        raise CheckFailed(f"sync to {conn.target.label}: the host offers no SFTP (no `Subsystem sftp` in its "
                          f"sshd_config, no sftp-server in {', '.join(SFTP_SERVERS)})") from e


def _describe(e: BaseException) -> str:
    return shown(getattr(e, "strerror", None) or str(e) or type(e).__name__)


def _read_manifest(sftp: paramiko.SFTPClient, root: str, uid: int) -> tuple[dict[str, dict], list[str]]:
    """What the host's copy says it holds, by path, and why it was set aside if it was: a manifest
    that is not a regular file of the account's, too large, unreadable, or that names a path
    outside the folder is ignored whole (every file is then checked and copied, none removed)."""
    path = f"{root}/{MANIFEST_NAME}"
    try:
        attrs = sftp.lstat(path)
    except FileNotFoundError:
        return {}, []
    entry = entry_of(attrs)
    if not entry.is_file or entry.uid not in (uid, 0):
        return {}, [f"{shown(path)} is not a regular file of this account's; mgpu ignores it"]
    if entry.size > MAX_MANIFEST_BYTES:
        return {}, [f"{shown(path)} is over {MAX_MANIFEST_BYTES >> 20} MB; mgpu ignores it"]
    with sftp.open(path, "rb") as f:
        text = f.read(MAX_MANIFEST_BYTES + 1)
    try:
        held = json.loads(text)["files"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return {}, [f"{shown(path)} cannot be read as a manifest; mgpu ignores it"]
    if not isinstance(held, dict):
        return {}, [f"{shown(path)} cannot be read as a manifest; mgpu ignores it"]
    for name, item in held.items():
        if not plain_relative(name):
            return {}, [f"{shown(path)} names a path outside the folder ({shown(repr(name)[:200])}); mgpu "
                        f"ignores the whole manifest, removes nothing it lists and checks every file"]
        if not _valid_entry(item):
            return {}, [f"{shown(path)} has an entry mgpu cannot read ({shown(repr(name)[:200])}); mgpu ignores it"]
    return held, []


def _valid_entry(item: object) -> bool:
    return (isinstance(item, dict) and isinstance(item.get("sha256"), str)
            and isinstance(item.get("mtime", 0), int) and isinstance(item.get("link", ""), str))


def _write_manifest(sftp: paramiko.SFTPClient, root: str, folder: SyncedFolder, mtimes: dict[str, int | None]) -> None:
    files = {f.path: {"sha256": f.sha256, "mode": f.mode,
                      **({"link": f.link} if f.link else {"mtime": mtimes.get(f.path)})}
             for f in folder.files}
    text = json.dumps({"source": folder.source, "digest": folder.digest, "files": files}, indent=1)
    path = f"{root}/{MANIFEST_NAME}"
    with sftp.open(path + _PART, "wb") as f:
        f.set_pipelined(True)
        f.write(text.encode("utf-8", "surrogateescape"))
    sftp.posix_rename(path + _PART, path)


def _send_tar(conn, root: str, source: str, files: Sequence[SyncedFile], progress: SyncProgress, mtime: int) -> bool:
    """Send `files` as one tar stream that the host's tar unpacks in `root`: one stream, no round
    trip per file. False, having sent nothing, when the host has no tar (then SFTP sends them).
    Nothing stands where the files go (clear_places) and their folders exist (make_parents)."""
    chan = conn.open_session(COMMAND_TIMEOUT)
    try:
        chan.settimeout(COMMAND_TIMEOUT)
        chan.exec_command(sh(f"umask 022; cd {shlex.quote(root)} || exit 126; command -v tar >/dev/null || exit 127; "
                             f"echo ready; exec tar -x -p --no-same-owner -f -"))
        replies = chan.makefile("rb")
        ready = b""
        for _ in range(_LOGIN_LINES):  # a login script may print before the command runs
            ready = replies.readline(_LOGIN_LINE_BYTES)
            if not ready or ready.strip() == b"ready":
                break
        if ready.strip() != b"ready":
            if chan.recv_exit_status() == 127:
                return False
            raise CheckFailed(f"sync to {conn.target.label}: cannot unpack in {shown(root)}: "
                              f"{_last_line(chan) or shown(ready.decode('utf-8', 'replace').strip())}")
        with chan.makefile("wb") as stream, tarfile.open(fileobj=stream, mode="w|", bufsize=1 << 20,
                                                         format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                info = tarfile.TarInfo(f.path)
                info.mtime = mtime
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
            raise CheckFailed(f"sync to {conn.target.label}: tar could not unpack in {shown(root)}: "
                              f"{_last_line(chan) or f'exit code {code}'}")
        return True
    finally:
        chan.close()


def _last_line(chan) -> str:
    err = b""
    while chan.recv_stderr_ready() and len(err) < (1 << 16):
        err += chan.recv_stderr(65536)
    return shown((err.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:500])


class _HashingReader:
    """A file as tarfile reads it, hashed and counted on the way."""

    def __init__(self, src, progress: SyncProgress):
        self._src = src
        self._progress = progress
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._src.read(size)
        self.digest.update(data)
        self._progress.add(len(data))
        return data


def _put(sftp: paramiko.SFTPClient, root: str, source: str, f: SyncedFile, progress: SyncProgress,
         mtime: int) -> None:
    """Send one file (or make one link) where nothing stands now (clear_places): written under a
    temporary name and renamed into place once whole and hashed."""
    remote = f"{root}/{f.path}"
    if f.link:
        sftp.symlink(f.link, remote)
        return
    digest = hashlib.sha256()
    try:
        src = open(os.path.join(source, f.path), "rb")
    except OSError as e:
        raise CheckFailed(f"sync: cannot read {os.path.join(source, f.path)}: {_describe(e)}") from e
    part = remote + _PART
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
    sftp.utime(part, (mtime, mtime))
    sftp.posix_rename(part, remote)
