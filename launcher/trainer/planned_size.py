"""The global batch of a run that resumes on another number of workers than it was planned for.

The launcher gives every task the number of workers the run was planned with, in
MGPU_WORLD_SIZE_MAX; after a host is lost (or taken back) the cluster restarts from its checkpoint
with fewer (or more) workers. Keeping the planned global batch keeps the training the same (the
learning rate was chosen for it, and the data stream goes on at the same examples per step):
each replica then takes a larger (or smaller) share of it. A batch that does not divide among the
replicas now running is replaced by the nearest one that does, and the log says so.

Without the variable, the batch is what the options say for the replicas now running, as for a
run that was never resized. Pure: no TensorFlow, no numpy, so a bad value is refused before the
slow import.
"""

from __future__ import annotations

import dataclasses

from launcher.errors import UsageError
from launcher.trainer.options import (DEFAULT_BATCH_SIZE_PER_REPLICA, TrainOptions, global_batch_size,
                                      nearest_multiple)

ENV_WORLD_SIZE_MAX = "MGPU_WORLD_SIZE_MAX"
# A value beyond any cluster: the variable is read from the environment, which anyone may set.
MAX_PLANNED_WORKERS = 1 << 20
_SHOWN_CHARS = 40  # of a bad value, in the error


@dataclasses.dataclass(frozen=True)
class BatchChoice:
    size: int  # examples per step over all replicas
    note: str | None  # the line the chief logs when the run is not at its planned size


def planned_workers(environ) -> int | None:
    """The planned number of training workers (chief and workers), or None where it is not set."""
    raw = environ.get(ENV_WORLD_SIZE_MAX)
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 7) or not 1 <= int(text) <= MAX_PLANNED_WORKERS:
        raise UsageError(f"{ENV_WORLD_SIZE_MAX} must be a number of workers from 1 to {MAX_PLANNED_WORKERS}, "
                         f"not {raw[:_SHOWN_CHARS]!r}")
    return int(text)


def choose_global_batch(opts: TrainOptions, replicas: int, workers: int, planned: int | None) -> BatchChoice:
    """The global batch for `replicas` replicas on `workers` workers of the `planned` ones."""
    if planned is None or planned == workers:
        return BatchChoice(global_batch_size(opts, replicas), None)
    # Every worker of a MultiWorkerMirroredStrategy has as many replicas as the others.
    planned_replicas = planned * max(1, replicas // workers)
    wanted = opts.global_batch_size or (opts.batch_size_per_replica or DEFAULT_BATCH_SIZE_PER_REPLICA) * planned_replicas
    where = (f"on {workers} of the {planned} planned workers" if workers < planned
             else f"on {workers} workers, {planned} planned")
    if wanted % replicas == 0:
        return BatchChoice(wanted, f"{where}: global batch {wanted} as planned, {wanted // replicas} per replica")
    size = nearest_multiple(wanted, replicas)
    return BatchChoice(size, f"{where}: the planned global batch {wanted} does not divide among {replicas} "
                             f"replicas; global batch {size}, {size // replicas} per replica")
