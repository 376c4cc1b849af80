"""The error file: how a task tells the launcher why it failed, in a form no log parsing can get wrong.

The launcher gives each local task a path in its run dir (protocol.ENV_ERROR_FILE, one per task
and attempt). A program that fails writes there a small JSON document, and the failure summary
shows it instead of guessing the cause from the task's output. The built-in trainer writes it;
any Python program can, with the `record` decorator:

    from launcher.error_file import record

    @record
    def main():
        ...

The document (every field a string, but frame and traceback may be null):
  version    1
  exception  the exception's type, e.g. "ValueError"
  message    its message (the whole of it, cut at MAX_MESSAGE characters)
  frame      "file:line in function: code" of the deepest frame outside Python's and the installed
             libraries' folders (the user's code), else the deepest frame
  traceback  the formatted traceback, its last MAX_TRACEBACK characters
  exit       "exception" (uncaught) or "error" (a failure the program reported and exits on)
  timestamp  when it was written, UTC, ISO 8601
Without the variable (a program not started by mgpu), nothing is written.

The same path is the task's TORCHELASTIC_ERROR_FILE, where torch's own `@record`
(torch.distributed.elastic.multiprocessing.errors.record) writes its document:
  {"message": {"message": "Type: message", "extraInfo": {"py_callstack": traceback, "timestamp": epoch seconds}}}
(or "message" a plain string); `parse` reads both.

Both sides import this module, so it stays within the standard library.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import re
import stat
import sysconfig
import traceback
from typing import Any, Callable, TypeVar

from launcher import protocol

VERSION = 1
MAX_BYTES = 64 * 1024  # a bigger file is not read
MAX_MESSAGE = 4000
MAX_TRACEBACK = 16000
EXIT_KINDS = ("exception", "error")

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class TaskError:
    exception: str
    message: str
    frame: str | None
    traceback: str | None
    exit: str
    timestamp: datetime.datetime

    @property
    def headline(self) -> str:
        """One line: "Type: first line of the message" (the message alone for a reported error)."""
        lines = self.message.strip().splitlines()
        first = lines[0] if lines else ""
        if self.exit == "error":
            return first or self.exception
        return f"{self.exception}: {first}" if first else self.exception


def file_name(task_type: str, index: int, attempt: int) -> str:
    """The error file of one attempt of one task, in the run dir."""
    return f"{task_type}-{index}.attempt{attempt}.error.json"


def _library_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.join(paths[key], "") for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths})


def user_frame(exc: BaseException) -> str | None:
    """The deepest frame of the traceback outside the standard and installed libraries, else the deepest."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    libraries = _library_folders()
    own = [f for f in frames if not f.filename.startswith(libraries) and not f.filename.startswith("<")]
    frame = (own or frames)[-1]
    where = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{where}: {frame.line.strip()}" if frame.line and frame.line.strip() else where


def document(exc: BaseException, exit: str = "exception") -> dict[str, Any]:
    """The error file's content for `exc`."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "version": VERSION,
        "exception": type(exc).__name__,
        "message": str(exc)[:MAX_MESSAGE],
        "frame": user_frame(exc),
        "traceback": text[-MAX_TRACEBACK:],
        "exit": exit,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
    }


def write(exc: BaseException, exit: str = "exception", path: str | None = None) -> bool:
    """Write the error file for `exc` (to `path`, else where the launcher said); True if written.

    Never raises: a program that is failing already must fail with its own error.
    """
    path = path or os.environ.get(protocol.ENV_ERROR_FILE)
    if not path:
        return False
    try:
        doc = document(exc, exit)
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8", "replace")
        if len(data) > MAX_BYTES:  # text of many wide characters: the traceback's end is enough
            doc["traceback"] = doc["traceback"][-MAX_TRACEBACK // 8:]
            data = json.dumps(doc, ensure_ascii=False).encode("utf-8", "replace")
        if len(data) > MAX_BYTES:
            return False
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)  # the reader sees all of it or nothing
        return True
    except Exception:
        return False


def record(function: _F) -> _F:
    """Decorator: an exception escaping `function` is written to the error file, then goes on up."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            write(exc)
            raise

    return wrapper  # type: ignore[return-value]


def parse(data: bytes) -> TaskError | None:
    """The error in an error file's bytes, mgpu's document or torch's; None when they are neither."""
    if len(data) > MAX_BYTES:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
        if isinstance(doc, dict) and "version" not in doc and "message" in doc:
            return _parse_torch(doc)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            return None
        exception, message, exit = doc["exception"], doc["message"], doc["exit"]
        frame, text = doc.get("frame"), doc.get("traceback")
        if not (isinstance(exception, str) and exception and isinstance(message, str) and exit in EXIT_KINDS):
            return None
        if not all(value is None or isinstance(value, str) for value in (frame, text)):
            return None
        timestamp = datetime.datetime.fromisoformat(doc["timestamp"])
        if timestamp.tzinfo is None:
            return None
    # RecursionError: brackets nested deeper than the JSON parser's stack ("[" * 60000).
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return None
    return TaskError(exception[:200], message[:MAX_MESSAGE], frame, text, exit, timestamp)


# A frame of a formatted traceback: `  File "path", line N, in function` and the code on the next line.
_FRAME = re.compile(r'^  File "([^"]*)", line (\d+), in (.*)\n(?:    (.*)\n)?', re.MULTILINE)


def _parse_torch(doc: dict) -> TaskError | None:
    """torch's `@record` document (its error_handler.record_exception)."""
    message = doc["message"]
    if isinstance(message, str):
        text, extra = message, {}
    elif isinstance(message, dict) and isinstance(message.get("message"), str):
        text, extra = message["message"], message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
    else:
        return None
    exception, _, rest = text.partition(": ")
    if not exception or not exception.replace(".", "").replace("_", "").isalnum():
        exception, rest = "Error", text
    callstack = extra.get("py_callstack")
    callstack = callstack[-MAX_TRACEBACK:] if isinstance(callstack, str) else None
    stamp = extra.get("timestamp")
    timestamp = (datetime.datetime.fromtimestamp(int(stamp), datetime.timezone.utc)
                 if isinstance(stamp, str) and stamp.isdecimal() else datetime.datetime.now(datetime.timezone.utc))
    return TaskError(exception[:200], rest[:MAX_MESSAGE], _traceback_frame(callstack), callstack, "exception",
                     timestamp)


def _traceback_frame(text: str | None) -> str | None:
    """user_frame's choice from a formatted traceback: the deepest frame outside the libraries."""
    frames = list(_FRAME.finditer(text or ""))
    if not frames:
        return None
    libraries = _library_folders()
    own = [f for f in frames if not f.group(1).startswith(libraries) and not f.group(1).startswith("<")]
    frame = (own or frames)[-1]
    where = f"{frame.group(1)}:{frame.group(2)} in {frame.group(3)}"
    return f"{where}: {frame.group(4).strip()}" if frame.group(4) and frame.group(4).strip() else where


def read(name: str, dir_fd: int) -> TaskError | None:
    """The error file `name` in the folder `dir_fd`: a regular file, never through a link, at most MAX_BYTES."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return parse(f.read(MAX_BYTES + 1))
    except OSError:
        return None
