"""The replicas' fingerprints at the end of a run: a checksum of each copy of the weights, gathered
from every replica, so that the chief can say whether they all ended the same."""

from __future__ import annotations

import hashlib

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
