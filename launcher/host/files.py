"""Files the user names (spec files, hostfiles, env files, ssh config, known_hosts, keys): checked
and read with a size limit, and only when they are regular files. A FIFO would block the
launcher forever, /dev/zero never ends, and a directory or a device is never what was meant."""

from __future__ import annotations

import os
import stat

from launcher.errors import UsageError

MAX_INPUT_BYTES = 16 * 1024 * 1024  # spec files, hostfiles, env files, ssh config: a 10,000-host spec is ~300 KB
MAX_KNOWN_HOSTS_BYTES = 64 * 1024 * 1024  # about 200,000 host keys

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _size_text(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit} bytes"


def _check_stat(st: os.stat_result, shown: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise UsageError(f"{shown}: is {kind}, not a regular file")
    if st.st_size > limit:
        raise UsageError(f"{shown}: larger than {_size_text(limit)} (the most mgpu reads)")


def check_input_file(path: str, option: str, limit: int = MAX_INPUT_BYTES, must_exist: bool = True) -> None:
    """Refuse, without opening it, a file that is missing (if must_exist), not a regular file, or over `limit`."""
    shown = f"{option} {path}"
    try:
        st = os.stat(os.path.expanduser(path))
    except FileNotFoundError:
        if must_exist:
            raise UsageError(f"{shown}: does not exist (No such file or directory)") from None
        return
    except OSError as exc:
        raise UsageError(f"{shown}: {exc.strerror or exc}") from None
    _check_stat(st, shown, limit)


def read_input_file(path: str, option: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. The file is opened without blocking
    and checked through its descriptor, so a FIFO put in its place after a check cannot hang the
    read, and reading stops at limit + 1 bytes whatever the file claims its size is."""
    shown = f"{option} {path}" if option else path
    try:
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{shown}: {exc.strerror or exc}") from None
    try:
        _check_stat(os.fstat(fd), shown, limit)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"{shown}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise UsageError(f"{shown}: larger than {_size_text(limit)} (the most mgpu reads)")
    return b"".join(chunks)
