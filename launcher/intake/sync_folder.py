"""Reading the folder of `--sync DIR`: which files it holds, their modes and hashes (I/O, before
planning; the plan carries the result, config.sync.SyncedFolder).

In a git work tree the files are those git would commit: tracked, and untracked but not ignored
(`git ls-files -co --exclude-standard`); elsewhere every file. Patterns in DIR/.mgpuignore (the
syntax of .gitignore) leave files out in both. Whatever cannot be copied faithfully is refused
with one line: a symbolic link that leaves the folder, a file that cannot be read, something that
is not a file, a total over the cap.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

import pathspec

from launcher.config.sync import IGNORE_FILE, MANIFEST_NAME, SyncedFile, SyncedFolder, human_bytes
from launcher.errors import UsageError

_CHUNK = 1 << 20


def read_synced_folder(directory: str, max_bytes: int, option: str = "--sync") -> SyncedFolder:
    """The files of `directory` as --sync copies them; UsageError naming the file that cannot be."""
    shown = f"{option} {directory}"
    root = os.path.realpath(directory)
    if not os.path.isdir(root):
        raise UsageError(f"{shown}: " + ("not a directory" if os.path.exists(root) else "no such directory"))
    paths = _listed(root, shown)
    ignored = _ignore_spec(root, shown)
    paths = sorted(p for p in paths if p != MANIFEST_NAME and not (ignored and ignored.match_file(p)))
    entries: list[tuple[str, os.stat_result]] = []
    total = 0
    for path in paths:
        try:
            st = os.lstat(os.path.join(root, path))
        except FileNotFoundError:
            continue  # tracked by git but deleted in the work tree
        except OSError as e:
            raise UsageError(f"{shown}: cannot read {path}: {e.strerror or e}") from None
        entries.append((path, st))
        total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        if total > max_bytes:
            raise UsageError(f"{shown}: more than {human_bytes(max_bytes)} to copy (at {path}); leave files out "
                             f"in {IGNORE_FILE} or raise --sync-max-size")
    return SyncedFolder(root, tuple(_synced_file(root, path, st, shown) for path, st in entries))


def _listed(root: str, shown: str) -> list[str]:
    """Relative paths of the files to copy (directories are made as their files need them)."""
    git = _git_files(root)
    if git is None:
        found = []
        for folder, dirs, files in os.walk(root):
            relative = os.path.relpath(folder, root)
            for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                found.append(name if relative == "." else f"{relative}/{name}")
        return found
    found = []
    for path in git:
        full = os.path.join(root, path)
        if os.path.isdir(full) and not os.path.islink(full):  # a submodule: its files, all of them
            for folder, _, files in os.walk(full):
                found += [os.path.relpath(os.path.join(folder, name), root) for name in files]
        else:
            found.append(path)
    return found


def _git_files(root: str) -> list[str] | None:
    """The files git lists in `root` (tracked, and untracked but not ignored); None outside a work tree."""
    try:
        done = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"],
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [os.fsdecode(p) for p in dict.fromkeys(done.stdout.split(b"\0")) if p]


def _ignore_spec(root: str, shown: str) -> pathspec.PathSpec | None:
    try:
        with open(os.path.join(root, IGNORE_FILE), encoding="utf-8") as f:
            return pathspec.GitIgnoreSpec.from_lines(f.read().splitlines())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{shown}: cannot read {IGNORE_FILE}: {getattr(e, 'strerror', None) or e}") from None


def _synced_file(root: str, path: str, st: os.stat_result, shown: str) -> SyncedFile:
    full = os.path.join(root, path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(full)
        resolved = os.path.realpath(full)
        if os.path.commonpath([resolved, root]) != root:
            raise UsageError(f"{shown}: {path} is a symbolic link to {target}, outside the folder: "
                             f"copy what it points to into the folder, or leave it out in {IGNORE_FILE}")
        # Relative, so that it points into the copy on every host.
        relative = os.path.relpath(resolved, os.path.dirname(full))
        return SyncedFile(path, 0, 0, hashlib.sha256(relative.encode("utf-8", "surrogateescape")).hexdigest(), relative)
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{shown}: {path} is not a regular file; leave it out in {IGNORE_FILE}")
    digest = hashlib.sha256()
    try:
        with open(full, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as e:
        raise UsageError(f"{shown}: cannot read {path}: {e.strerror or e}") from None
    return SyncedFile(path, stat.S_IMODE(st.st_mode), st.st_size, digest.hexdigest())
