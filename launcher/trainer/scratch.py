"""The task's own temporary folder, removed when the task ends.

TensorFlow's autograph writes a source file for every function it converts into the temporary
folder, and removes them in an atexit handler. A training task ends with os._exit (run.leave),
which skips atexit handlers, so every start of every task left its files in /tmp: 33 per task of a
run of the small model, again at every restart. With `tempfile` pointed at a folder of the task's
own, removed at the end whichever way the task ends short of a kill, nothing is left.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile

_folder: str | None = None


def use_own_folder() -> str:
    """Make a folder in the temporary folder the one `tempfile` uses from now on; its path."""
    global _folder
    _folder = tempfile.mkdtemp(prefix="mgpu-task-")
    tempfile.tempdir = _folder
    atexit.register(remove)
    return _folder


def remove() -> None:
    """Remove the task's folder and what is in it (once; later calls do nothing)."""
    global _folder
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
        _folder = None
