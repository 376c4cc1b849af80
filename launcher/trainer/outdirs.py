"""The folders the trainer writes into (--model-dir, --export-dir), checked before training.

Checkpoints, summaries and exports are written by TensorFlow and Keras through paths, which
a link planted in the folder could redirect. So an output folder must be the user's own (or
root's) and not writable by others, sticky or not (a sticky folder still takes new links
from anyone): a folder such as
/tmp/run1 made beforehand by another user is refused. A missing folder is made here (mode
0755, whatever the umask), so that no one else can make it first between the check and the
first write. The JSON files the trainer writes itself there (metrics.json, eval_results.json)
are written so that no link planted in the folder redirects them either (write_json).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import stat

from launcher.errors import UsageError


def check_output_dirs(named: dict[str, str | None]) -> None:
    """named: option -> folder (None when not given). Raises UsageError for one that cannot be used."""
    for option, path in named.items():
        if path is not None and "://" not in path:  # gs://, s3://: not a local folder
            _check_output_dir(option, path)


def _check_output_dir(option: str, path: str) -> None:
    missing = []
    folder = os.path.abspath(path)
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    try:
        for made in reversed(missing):
            try:
                os.mkdir(made, 0o755)
            except FileExistsError:
                continue  # another task of the run made it: checked below like any other
            os.chmod(made, 0o755)
        st = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{option} {path}: not a directory")
    if st.st_uid not in (os.geteuid(), 0):
        raise UsageError(f"{option} {path}: owned by {_owner_name(st.st_uid)}, not by you; use a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):  # sticky or not: others could still add links to it
        raise UsageError(f"{option} {path}: writable by other users; make it private (chmod go-w) or use another")


def _owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def write_json(path: str, data: dict) -> None:
    """Write atomically, so a reader never sees half a file.

    The model dir may be one that others can write (a shared /tmp folder): the temporary file
    gets an unguessable name and is created new (O_EXCL) without following a symbolic link, and
    both it and the rename are addressed through the directory's descriptor, so no link planted
    in the folder, or in place of it, can make the trainer write another file.
    """
    directory, name = os.path.split(path)
    dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        partial = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(partial, _CREATE_NEW, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.write("\n")
            os.replace(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(partial, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(dir_fd)


_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
