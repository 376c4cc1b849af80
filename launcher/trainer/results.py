"""End-of-run results: replica fingerprints and metrics.json."""

from __future__ import annotations

import hashlib
import json
import os
import secrets

import tensorflow as tf


def local_fingerprints(strategy: tf.distribute.Strategy, variables) -> list[int]:
    """A 48-bit checksum of the variables' bytes, for each local replica's copy."""
    per_replica_bytes = None
    for v in variables:
        v = v if isinstance(v, tf.Variable) else v.value
        copies = strategy.experimental_local_results(v)
        if per_replica_bytes is None:
            per_replica_bytes = [hashlib.sha256() for _ in copies]
        for digest, copy in zip(per_replica_bytes, copies):
            digest.update(copy.numpy().tobytes())
    # 48 bits survive the float64 the collective carries them in.
    return [int(d.hexdigest()[:12], 16) for d in per_replica_bytes]


def gather_fingerprints(strategy: tf.distribute.Strategy, local: list[int]) -> list[str]:
    """Collective: every replica's fingerprint, in replica order, as hex strings."""
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([float(local[ctx.replica_id_in_sync_group % len(local)])],
                                tf.float64))

    @tf.function
    def gather(value):
        def replica(x):
            return tf.distribute.get_replica_context().all_gather(tf.identity(x), axis=0)
        return strategy.run(replica, args=(value,))

    gathered = strategy.experimental_local_results(gather(values))[0].numpy()
    return [f"{int(x):012x}" for x in gathered]


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
