"""The quarantine file of this user: hosts that runs left out for a fault of the host, kept for later
runs (what it holds and how it is checked: config/quarantine.py).

It lives in the user's state folder ($XDG_STATE_HOME/mgpu, or ~/.local/state/mgpu), mode 0600 in a
folder of mode 0700. Every change is made under an exclusive lock (flock on a lock file beside it)
and written whole to a new file that replaces the old one at once (os.replace), so that runs that
change it together lose nothing of each other's, and a reader never sees half a file. A file that
fails its checks (or is not a regular file of this user's) is set aside under a name of its own,
said once in a warning, and an empty quarantine takes its place. Nothing here raises: what cannot
be read or written is a warning, and the run goes on without the quarantine.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from typing import Callable, Iterator, Sequence

from launcher.config import quarantine
from launcher.config.quarantine import Entry

FILE_NAME = "quarantine.json"
LOCK_NAME = "quarantine.lock"


def state_folder(environ=os.environ) -> str:
    """mgpu's folder in the user's state directory (XDG_STATE_HOME where it is an absolute path)."""
    base = environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "mgpu")


class QuarantineFile:
    """The quarantine file in `folder`. `warn` takes each warning (one line)."""

    def __init__(self, folder: str | None = None, warn: Callable[[str], None] = lambda text: None):
        self.folder = folder or state_folder()
        self.path = os.path.join(self.folder, FILE_NAME)
        self.warn = warn

    def entries(self, now: float | None = None) -> tuple[Entry, ...]:
        """The entries in force now; () when there is no file or it cannot be read (warned)."""
        now = time.time() if now is None else now
        if not os.path.exists(self.path):  # nothing to read: no folder made for it
            return ()
        try:
            with self._locked():
                return tuple(quarantine.in_force(self._read(), now).values())
        except OSError as e:
            self.warn(f"cannot read the quarantine file {self.path}: {e.strerror or e}; no host is taken as quarantined")
            return ()

    def change(self, how: Callable[[Sequence[Entry], float], Sequence[Entry]], now: float | None = None) -> bool:
        """Replace the entries with how(entries, now), under the lock; False (warned) when it cannot."""
        now = time.time() if now is None else now
        try:
            with self._locked():
                self._write(quarantine.render(how(self._read(), now)))
            return True
        except OSError as e:
            self.warn(f"cannot write the quarantine file {self.path}: {e.strerror or e}")
            return False

    def add(self, added: Sequence[Entry]) -> bool:
        return self.change(lambda entries, now: quarantine.with_added(entries, added, now))

    def clear(self, hosts: Sequence[str]) -> bool:
        return self.change(lambda entries, now: quarantine.without(entries, hosts, now))

    # -- under the lock ---------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        st = os.lstat(self.folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise OSError(errno.EPERM, "the folder is not a folder of this user's that only they may write")
        fd = os.open(os.path.join(self.folder, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # and with it the lock

    def _read(self) -> tuple[Entry, ...]:
        """The file's entries; a file that fails its checks is set aside (warned) and counts as empty."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return ()
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            return self._set_aside("a symbolic link")
        with os.fdopen(fd, "rb") as file:
            st = os.fstat(file.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return self._set_aside("not a regular file of this user's")
            data = file.read(quarantine.MAX_BYTES + 1)
        try:
            return quarantine.parse(data.decode("utf-8"))
        except UnicodeDecodeError:
            return self._set_aside("not UTF-8 text")
        except quarantine.Unreadable as e:
            return self._set_aside(str(e))

    def _set_aside(self, why: str) -> tuple[Entry, ...]:
        aside = f"{self.path}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        os.rename(self.path, aside)
        self.warn(f"the quarantine file {self.path} is unreadable ({why}): set aside as {aside}; "
                  f"no host is taken as quarantined")
        return ()

    def _write(self, text: str) -> None:
        fd, temporary = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=self.folder)  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
