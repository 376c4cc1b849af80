"""A synced folder on a host, seen as something another user of the host may have prepared: the
checks `--sync` makes over SFTP before it writes anything there, after OpenSSH's StrictModes.

- The workdir must be a real folder (not a link) owned by the launching account and writable by
  no one else; mgpu makes it when it is missing. Every folder above it must belong to that account
  or to root and be writable by no one else, unless it is sticky (as /tmp is: there no one else
  can rename or remove what the account made). A link above it must belong to the account or root.
  Whoever else could write in any of them could put a program of their own where the tasks run it.
- Inside the copy, what the host holds is read with lstat (an SFTP folder listing), never through
  a link: a path that must be a folder and is a link, or a folder another account owns or can
  write, is refused, and a file is taken as holding what the manifest says only while its type,
  owner, size and modification time are the ones mgpu left.
- Every path the host's manifest names is data: one that is absolute, climbs out with `..`, or is
  not in its plainest form is refused, and the whole manifest with it.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import stat
from typing import Iterable, Sequence

import paramiko

from launcher.errors import CheckFailed
from launcher.shell import sh
from launcher.supervise.console_text import console_safe

MAX_LISTED = 1_000_000  # entries read from one folder of the copy: a folder of run outputs may be large
_MAX_ANSWER = 1 << 20  # of what the uid's session prints, login scripts included
_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def account_uid(conn, host: str, timeout: float) -> int:
    """The uid the host gives the run's account: what every folder mgpu writes in must belong to.
    Read from `id -u` in a session of its own, bounded in time and size (a login script may print
    anything before it)."""
    chan = conn.open_session(timeout)
    try:
        chan.settimeout(timeout)
        chan.exec_command(sh("echo; echo mgpu-uid:$(id -u)"))
        chan.shutdown_write()
        out = bytearray()
        while len(out) < _MAX_ANSWER and (data := chan.recv(65536)):
            out += data
    except (OSError, EOFError, paramiko.SSHException) as e:
        raise _refuse(host, f"cannot learn the account's uid: {e or type(e).__name__}") from e
    finally:
        chan.close()
    for line in reversed(bytes(out[:_MAX_ANSWER]).splitlines()):
        match = re.fullmatch(rb"mgpu-uid:([0-9]{1,10})", line.strip())
        if match:
            return int(match.group(1))
    raise _refuse(host, "cannot learn the account's uid: `id -u` did not answer")


def shown(path: str) -> str:
    """A path from the host, or naming something there, as a terminal may show it."""
    return console_safe(path)


def plain_relative(path: object) -> bool:
    """Whether a path read from the host stays inside the folder, as a synced file's own path is
    written: relative, no `..`, `.` or empty part, no NUL."""
    if not isinstance(path, str) or not path or len(path) > 4096 or "\0" in path:
        return False
    if path.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


@dataclasses.dataclass(frozen=True)
class Entry:
    """What lstat says of one path of the copy."""
    mode: int  # st_mode, type bits included
    size: int
    mtime: int
    uid: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)


def entry_of(attrs: paramiko.SFTPAttributes) -> Entry:
    return Entry(attrs.st_mode or 0, attrs.st_size or 0, int(attrs.st_mtime or 0),
                 -1 if attrs.st_uid is None else attrs.st_uid)


def _refuse(host: str, why: str) -> CheckFailed:
    return CheckFailed(f"sync to {host}: {why}")


def own_folder(sftp: paramiko.SFTPClient, host: str, folder: str, uid: int) -> str:
    """Make `folder` (absolute) on the host, or accept the one there, only where no one but the
    account `uid` (and root) can change it or what leads to it; its path. CheckFailed, one line
    naming the folder and why, otherwise."""
    folder = posixpath.normpath(folder)
    if folder == "/":
        raise _refuse(host, "the workdir cannot be /")
    _check_parents(sftp, host, posixpath.dirname(folder), uid)
    try:
        attrs = sftp.lstat(folder)
    except FileNotFoundError:
        try:
            sftp.mkdir(folder, 0o755)
        except OSError:
            pass  # made by someone else meanwhile, or not allowed: lstat says which
        try:
            attrs = sftp.lstat(folder)
        except FileNotFoundError:
            raise _refuse(host, f"cannot make the folder {shown(folder)}") from None
    check_own_folder(host, folder, entry_of(attrs), uid)
    return folder


def check_own_folder(host: str, folder: str, entry: Entry, uid: int) -> None:
    """A folder mgpu writes in: the account's own, writable by no one else, not a link."""
    if entry.is_link:
        raise _refuse(host, f"{shown(folder)} is a symbolic link; mgpu writes only in a real folder "
                            f"(give --workdir the folder it points to, if that is yours)")
    if not entry.is_dir:
        raise _refuse(host, f"{shown(folder)} exists and is not a folder")
    if entry.uid != uid:
        raise _refuse(host, f"{shown(folder)} belongs to another account (uid {entry.uid}, not {uid}): "
                            f"its files could be anyone's; choose another --workdir")
    if entry.mode & _GROUP_OR_OTHER_WRITE:
        raise _refuse(host, f"{shown(folder)} is writable by other accounts (mode "
                            f"{stat.S_IMODE(entry.mode):04o}): they could change what the tasks run; "
                            f"`chmod go-w` it, or choose another --workdir")


def _check_parents(sftp: paramiko.SFTPClient, host: str, parent: str, uid: int) -> None:
    """Every folder above the workdir, as written and as the links in it resolve."""
    try:
        resolved = sftp.normalize(parent)
    except FileNotFoundError:
        resolved = None  # made below, then resolved again
    for path in _prefixes(parent):
        try:
            entry = entry_of(sftp.lstat(path))
        except FileNotFoundError:
            _make_parent(sftp, host, path)
            entry = entry_of(sftp.lstat(path))
        _check_parent(host, path, entry, uid)
    if resolved is None:
        resolved = sftp.normalize(parent)
    for path in _prefixes(resolved):
        _check_parent(host, path, entry_of(sftp.lstat(path)), uid)


def _make_parent(sftp: paramiko.SFTPClient, host: str, path: str) -> None:
    try:
        sftp.mkdir(path, 0o755)
    except OSError:
        try:
            sftp.lstat(path)
        except FileNotFoundError:
            raise _refuse(host, f"cannot make the folder {shown(path)}") from None


def _check_parent(host: str, path: str, entry: Entry, uid: int) -> None:
    if entry.uid not in (0, uid):
        what = "a symbolic link" if entry.is_link else "a folder"
        raise _refuse(host, f"{shown(path)} is {what} of another account (uid {entry.uid}): it could put "
                            f"other files where the tasks run; choose a --workdir under folders only you or "
                            f"root can change")
    if entry.is_link:
        return
    if not entry.is_dir:
        raise _refuse(host, f"{shown(path)} exists and is not a folder")
    if entry.mode & _GROUP_OR_OTHER_WRITE and not entry.mode & stat.S_ISVTX:
        raise _refuse(host, f"{shown(path)} is writable by other accounts and not sticky (mode "
                            f"{stat.S_IMODE(entry.mode):04o}): they could put another folder in place of the "
                            f"workdir; choose a --workdir under folders only you or root can change")


def _prefixes(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b', '/a/b/c'] ('/' itself is root's)."""
    parts = [part for part in posixpath.normpath(path).split("/") if part]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def scan(sftp: paramiko.SFTPClient, host: str, root: str, paths: Iterable[str], uid: int) -> dict[str, Entry]:
    """lstat of `paths` (relative to `root`, plain) and of the folders that lead to them, as the
    host's folder listings say, never through a link: a path below a link or a file is absent. A
    folder on the way that is not the account's own, or that others can write, is refused."""
    folders: set[str] = set()
    for path in paths:
        folder = posixpath.dirname(path)
        while folder not in folders:
            folders.add(folder)
            if not folder:
                break
            folder = posixpath.dirname(folder)
    found: dict[str, Entry] = {}
    for folder in sorted(folders, key=lambda f: (f.count("/"), f) if f else (-1, "")):
        if folder:
            entry = found.get(folder)
            if entry is None or not entry.is_dir:
                continue  # missing, or not a folder: nothing below it is there
            check_own_folder(host, f"{root}/{folder}", entry, uid)
        for count, attrs in enumerate(sftp.listdir_iter(f"{root}/{folder}" if folder else root)):
            if count >= MAX_LISTED:
                raise _refuse(host, f"{shown(root + '/' + folder)} holds over {MAX_LISTED:,} entries")
            found[posixpath.join(folder, attrs.filename)] = entry_of(attrs)
    return found


def remove_gone(sftp: paramiko.SFTPClient, root: str, tree: dict[str, Entry], paths: Sequence[str]) -> list[str]:
    """Remove files and links the folder no longer has, then their folders that are left empty:
    only what lstat found in the account's own folders, never through a link. What was not
    removed because it lies beyond a link or a file, said."""
    warnings = []
    folders = set()
    for path in paths:
        entry = tree.get(path)
        if entry is None:
            if _beyond_a_link(tree, path):
                warnings.append(f"{shown(path)} was not removed: it lies beyond a link or a file in {shown(root)}")
            continue
        if entry.is_dir:
            continue  # a folder of the runs' now, or emptied below
        sftp.remove(f"{root}/{path}")
        del tree[path]
        folder = posixpath.dirname(path)
        while folder:
            folders.add(folder)
            folder = posixpath.dirname(folder)
    for folder in sorted(folders, key=lambda d: -d.count("/")):
        if tree.get(folder) is not None and tree[folder].is_dir:
            try:
                sftp.rmdir(f"{root}/{folder}")
                del tree[folder]
            except OSError:
                pass  # not empty: it holds files of the folder, or of the runs
    return warnings


def _beyond_a_link(tree: dict[str, Entry], path: str) -> bool:
    folder = posixpath.dirname(path)
    while folder:
        entry = tree.get(folder)
        if entry is not None and not entry.is_dir:
            return True
        folder = posixpath.dirname(folder)
    return False


def clear_places(sftp: paramiko.SFTPClient, host: str, root: str, tree: dict[str, Entry], paths: Sequence[str]) -> None:
    """Remove what stands where a file is to be copied (an older file, a link, a FIFO), so that
    nothing is written through it; a folder there is refused unless it is empty."""
    for path in paths:
        entry = tree.pop(path, None)
        if entry is None:
            continue
        if entry.is_dir:
            try:
                sftp.rmdir(f"{root}/{path}")
            except OSError:
                raise _refuse(host, f"{shown(root)}/{shown(path)} is a folder on the host where "
                                  f"the synced folder has a file; remove it") from None
        else:
            sftp.remove(f"{root}/{path}")


def make_parents(sftp: paramiko.SFTPClient, host: str, root: str, tree: dict[str, Entry], paths: Sequence[str],
                  uid: int) -> None:
    """The folders the files to copy go in, made here (so that tar makes none with the host's
    umask) and checked as the account's own; a link or a file where one must be is refused."""
    needed = set()
    for path in paths:
        folder = posixpath.dirname(path)
        while folder:
            needed.add(folder)
            folder = posixpath.dirname(folder)
    for folder in sorted(needed, key=lambda d: d.count("/")):
        entry = tree.get(folder)
        if entry is not None and entry.is_dir:
            continue  # scan checked it
        if entry is not None:
            kind = "a link" if entry.is_link else "not a folder"
            raise _refuse(host, f"{shown(root)}/{shown(folder)} is {kind} on the host where the synced "
                              f"folder has a folder; remove it")
        try:
            sftp.mkdir(f"{root}/{folder}", 0o755)
        except OSError:
            pass  # lstat says what is there
        attrs = sftp.lstat(f"{root}/{folder}")
        tree[folder] = entry_of(attrs)
        check_own_folder(host, f"{root}/{folder}", tree[folder], uid)
