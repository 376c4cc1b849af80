"""Checkpoints in --model-dir, written by every worker, kept by the chief.

Only the chief reads the model directory: it restores, then broadcasts every variable to
the other workers, so the directory need not be shared between hosts.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import tensorflow as tf

from launcher import protocol


def _tf_variable(v):
    """The tf.Variable behind a Keras variable."""
    return v if isinstance(v, tf.Variable) else v.value


class Checkpointer:
    def __init__(self, items: dict, model_dir: str | None, is_chief: bool, worker_index: int, keep: int,
                 *, added: dict | None = None, before_save=None):
        """`items`: what every checkpoint holds; `added`: what this version adds, which a checkpoint
        written by an older one lacks (restored only where present); `before_save(step)`: brings
        them up to date before each save."""
        self._checkpoint = tf.train.Checkpoint(**items, **(added or {}))
        self._older = tf.train.Checkpoint(**items) if added else None
        self._added = tuple(added or ())
        self._before_save = before_save
        self._model_dir = model_dir
        self._is_chief = is_chief
        self._worker_index = worker_index
        self._manager = None
        if model_dir is not None and is_chief:
            self._manager = tf.train.CheckpointManager(self._checkpoint, model_dir, max_to_keep=keep)
        self.last_saved_step: int | None = None

    @property
    def enabled(self) -> bool:
        return self._model_dir is not None

    def restore_latest(self) -> tuple[str | None, bool]:
        """On the chief: restore the newest checkpoint, if any. Returns its path (None: there is
        none) and whether it held the added items too."""
        if self._manager is None or self._manager.latest_checkpoint is None:
            return None, False
        path = self._manager.latest_checkpoint
        held = {name.split("/", 1)[0] for name, _ in tf.train.list_variables(path)}
        complete = all(name in held for name in self._added)
        (self._checkpoint if complete or self._older is None else self._older).restore(path).assert_existing_objects_matched()
        return path, complete

    def save(self, step: int) -> None:
        """Every worker calls this at the same step; only the chief's copy is kept."""
        if not self.enabled or self.last_saved_step == step:
            return
        if self._before_save is not None:
            self._before_save(step)
        if self._manager is not None:
            self._manager.save(checkpoint_number=step)
            if protocol.ENV_RUN_ID in os.environ:  # the launcher takes a host back right after one
                print(protocol.checkpoint_line(step), flush=True)
        else:
            scratch = tempfile.mkdtemp(prefix=f"mgpu-ckpt-worker{self._worker_index}-")
            try:
                tf.train.CheckpointManager(self._checkpoint, scratch, max_to_keep=1).save(
                    checkpoint_number=step)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        self.last_saved_step = step


def broadcast_from_first_replica(strategy: tf.distribute.Strategy, variables) -> None:
    """Overwrite every replica's copy with replica 0's (the chief's) values.

    A sum in which all other replicas contribute zeros is exact, so this is a broadcast
    built from the all-reduce every strategy has.
    """
    variables = [_tf_variable(v) for v in variables]

    @tf.function
    def reduced():
        def replica():
            ctx = tf.distribute.get_replica_context()
            first = tf.equal(ctx.replica_id_in_sync_group, 0)
            values = []
            for v in variables:
                # One dtype for all: the collective concatenates them. float64 holds
                # every float32 and int64 step count exactly.
                x = tf.cast(v.read_value(), tf.float64)
                values.append(tf.where(first, x, tf.zeros_like(x)))
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)
        return strategy.run(replica)

    local = tf.nest.map_structure(lambda x: strategy.experimental_local_results(x)[0], reduced())
    for v, value in zip(variables, local):
        v.assign(tf.cast(value, v.dtype))
