"""SIGTERM handling: all workers agree on one step at which to save and stop.

A signal may reach any subset of the workers at any time. Each worker only notes it;
between loop calls every worker contributes its note to an all-reduce, so all of them
learn of the request at the same step, save the same checkpoint, and exit with
EXIT_PREEMPTED.
"""

from __future__ import annotations

import signal

import tensorflow as tf


class Preempted(Exception):
    def __init__(self, step: int):
        super().__init__(f"preempted at step {step}")
        self.step = step


class PreemptionWatcher:
    def __init__(self, strategy: tf.distribute.Strategy):
        self._requested = False
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

        @tf.function
        def any_requested(flag):
            def replica(f):
                ctx = tf.distribute.get_replica_context()
                # A fresh tensor on the replica's device (an input has no device to reduce to).
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(f))
            total = strategy.run(replica, args=(flag,))
            return strategy.experimental_local_results(total)[0] > 0

        self._any_requested = any_requested

    def _on_sigterm(self, signum, frame):
        self._requested = True

    def agreed(self) -> bool:
        """Collective: True on every worker once any worker received SIGTERM."""
        return bool(self._any_requested(tf.constant(1.0 if self._requested else 0.0)))

    def close(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)
