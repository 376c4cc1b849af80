"""What `--sync DIR` copies to every remote host, as data: the files of the folder with their
hashes and modes, and one digest of them all. Pure: intake/sync_folder.py reads the folder,
fleet/sync.py copies it."""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath

DEFAULT_SYNC_MAX_BYTES = 1 << 30  # 1 GiB: a program and its small files, not a data set
# Where a host keeps a synced folder when no --workdir says: relative to the login directory.
DEFAULT_SYNC_PARENT = "mgpu-sync"
# The host's record of what it holds (in the synced folder): only changed files are copied again.
MANIFEST_NAME = ".mgpu-sync.json"
IGNORE_FILE = ".mgpuignore"
DEFAULT_SETUP_TIMEOUT = 1800.0


@dataclasses.dataclass(frozen=True)
class SyncedFile:
    path: str  # relative to the folder, '/'-separated
    mode: int  # permission bits (0 for a symbolic link)
    size: int
    sha256: str  # of the content, or of a link's target
    link: str | None = None  # a symbolic link's target (relative, inside the folder)


@dataclasses.dataclass(frozen=True)
class SyncedFolder:
    source: str  # the folder on this machine, absolute
    files: tuple[SyncedFile, ...]  # sorted by path
    digest: str = ""

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", folder_digest(self.files))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def folder_digest(files: tuple[SyncedFile, ...]) -> str:
    """One hash of every file's path, mode, content (or link target): equal digests, equal files."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.mode:o}\0{f.sha256}\0{f.link or ''}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def default_workdir(source: str) -> str:
    """The remote folder of a synced folder when no --workdir names one: under the login directory,
    named after the folder."""
    return posixpath.join(DEFAULT_SYNC_PARENT, posixpath.basename(source.rstrip("/")) or "root")


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
