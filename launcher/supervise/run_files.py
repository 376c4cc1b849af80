"""What `mgpu status`, `logs`, `attach` and `stop` read of a run's folder, and how.

A log dir may be shared, and what is in it may have been put there by someone else. So a run
folder is read only if it passes the checks a launch applies to its --log-dir, and more: it is the
user's own, not a link, and writable by no one else (a launch makes it 0700). Its files are opened
by name under the folder's descriptor, never through a link, without blocking (a FIFO is refused,
not waited on), and only if they are regular files of the user's. run.json is read up to
MAX_RECORD_BYTES and its shape checked before anything uses it: a run whose record is not what a
launch writes is shown as unreadable, with the reason, and the others are still listed.
"""

from __future__ import annotations

import codecs
import errno
import json
import math
import os
import stat
from typing import Any, Callable

from launcher.supervise.console_text import console_safe

RECORD_NAME = "run.json"
END_NAME = "run-end.json"  # runrecord.END_NAME: the run's end where run.json could not take it
MAX_END_BYTES = 4096
MAX_RECORD_BYTES = 32 << 20  # a 1,000-task run with ten restarts writes about 8 MB
MAX_INT = 1 << 63
MAX_NUMBER = 1e18


class Unreadable(Exception):
    """A run folder or file that is not read: the reason, one line."""


class NotYours(Unreadable):
    """Not a run folder of this user's at all: a link, a file, another user's folder."""


def _checked_folder(st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise NotYours("not a folder")
    if st.st_uid != os.geteuid():
        raise NotYours("not yours")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Unreadable(f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})")


def open_folder(path: os.PathLike | str) -> int:
    """The run folder's descriptor. FileNotFoundError when it is gone; Unreadable for a link, a
    folder that is not the user's, or one others may write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        if os.path.islink(path) or e.errno == errno.ENOTDIR:
            raise NotYours("a link or a file, not a folder") from None
        raise Unreadable(e.strerror or str(e)) from None
    try:
        _checked_folder(os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(folder_fd: int, name: str) -> int:
    """A file of the run, for reading: a regular file of the user's, never through a link and never
    blocking. FileNotFoundError when it is not there; Unreadable otherwise."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise Unreadable(f"{name}: {'a link' if e.errno == errno.ELOOP else (e.strerror or e)}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise Unreadable(f"{name}: {'not a regular file' if not stat.S_ISREG(st.st_mode) else 'not yours'}")
    return fd


def open_run_file(path: os.PathLike | str, name: str) -> int:
    """open_file of the run folder at `path`."""
    folder = open_folder(path)
    try:
        return open_file(folder, name)
    finally:
        os.close(folder)


def read_record(folder_fd: int) -> dict[str, Any]:
    """The run's record, its shape checked. FileNotFoundError without one; Unreadable for one that
    is too big, not JSON, or not shaped as a launch writes it."""
    fd = open_file(folder_fd, RECORD_NAME)
    try:
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise Unreadable(f"{RECORD_NAME} is over {MAX_RECORD_BYTES >> 20} MiB")
    try:
        record = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise Unreadable(f"{RECORD_NAME} is nested too deeply") from None
    except ValueError as e:  # not JSON, not UTF-8, NaN, an integer of thousands of digits
        raise Unreadable(f"{RECORD_NAME} is not valid JSON: {str(e)[:100]}") from None
    _RECORD(record, "run.json")
    return record


def read_bounded(folder_fd: int, name: str, limit: int) -> bytes | None:
    """The bytes of file `name` of the run folder, opened as open_file opens it; None where it is
    missing, unreadable, or over `limit` bytes."""
    try:
        fd = open_file(folder_fd, name)
    except (FileNotFoundError, Unreadable):
        return None
    try:
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def read_end(folder_fd: int) -> dict[str, Any] | None:
    """The run's end from END_NAME, its shape checked; None while it holds none (or is not one)."""
    data = read_bounded(folder_fd, END_NAME, MAX_END_BYTES)
    if data is None or not data.strip():
        return None
    try:
        end = json.loads(data, parse_constant=_no_constant)
        _END(end, END_NAME)
    except (ValueError, RecursionError, Unreadable):
        return None
    return end if end.get("status") else None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


# The shape of a record, as far as the commands read it: each checker raises Unreadable naming the
# field. Fields a launch may leave out are optional; fields the commands do not read are not checked.
Check = Callable[[Any, str], None]


def _wrong(where: str, value: Any, wanted: str) -> Unreadable:
    return Unreadable(f"{where} is {type(value).__name__ if value is not None else 'null'}, not {wanted}")


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise _wrong(where, value, "text")


def _int(value: Any, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong(where, value, "an integer")
    if not -MAX_INT <= value < MAX_INT:
        raise Unreadable(f"{where} is out of range")


def _number(value: Any, where: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _wrong(where, value, "a number")
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise Unreadable(f"{where} is out of range")


def _flag(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise _wrong(where, value, "true or false")


def _optional(check: Check) -> Check:
    def optional(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)
    return optional


def _fields(**checks: Check) -> Check:
    def fields(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _wrong(where, value, "an object")
        for name, check in checks.items():
            check(value.get(name), f"{where}.{name}")
    return fields


def _list_of(check: Check) -> Check:
    def list_of(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise _wrong(where, value, "a list")
        for i, item in enumerate(value):
            check(item, f"{where}[{i}]")
    return list_of


def _map_of(check: Check) -> Check:
    def map_of(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _wrong(where, value, "an object")
        for key, item in value.items():
            check(item, f"{where}[{console_safe(key[:40])!r}]")
    return map_of


_TEXT, _INT, _NUMBER = _optional(_text), _optional(_int), _optional(_number)
_PROGRESS = _optional(_fields(step=_int, total=_INT, rate=_NUMBER, eta_s=_NUMBER, at=_TEXT))
_BUSY = _optional(_fields(share=_NUMBER, source=_TEXT, window_s=_NUMBER))
_TASK = _fields(host=_TEXT, pid=_INT, log=_TEXT, started_at=_TEXT, ready_at=_TEXT, ended_at=_TEXT, exit_code=_INT,
                signal=_TEXT, failure_ignored=_optional(_flag), last_line=_TEXT, progress=_PROGRESS, busy=_BUSY)
_SLOWEST = _optional(_fields(task=_text, host=_text, busy=_number, at=_TEXT))
_ATTEMPT = _fields(attempt=_INT, started_at=_TEXT, ended_at=_TEXT, outcome=_TEXT, tasks=_optional(_map_of(_TASK)),
                   slowest=_SLOWEST)
_PLAN = _fields(type=_TEXT, index=_INT, host=_TEXT)
_RECORD = _fields(run_id=_TEXT, status=_TEXT, message=_TEXT, exit_code=_INT, supervisor_pid=_INT,
                  supervisor_host=_TEXT, lock_dir=_TEXT, started_at=_TEXT, ended_at=_TEXT,
                  options=_optional(_fields(grace_period=_NUMBER)), plans=_optional(_list_of(_PLAN)),
                  attempts=_optional(_list_of(_ATTEMPT)))
_END = _fields(status=_TEXT, message=_TEXT, exit_code=_INT, ended_at=_TEXT)


class SafeOutput:
    """A binary stream's bytes as a terminal may show them: UTF-8 (invalid bytes replaced), every
    control character but newline and tab as a visible escape (console_text.console_safe)."""

    def __init__(self, out):
        self._out = out
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        self._out.write("\n".join(console_safe(part) for part in text.split("\n")).encode("utf-8"))

    def flush(self) -> None:
        self._out.flush()
