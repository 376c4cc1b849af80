"""What a checkpoint holds besides the model, the optimizer and the step, so that a run resumes on
any number of workers: where it is in the stream of training examples, and how many workers wrote it.

Every value in a checkpoint is one value for the whole cluster, so it restores at any size: the
chief restores it and hands it to every worker now running (checkpoints.broadcast_from_first_replica).
What a worker keeps of its own is either not checkpointed or shared out again:
- the model's and the optimizer's variables (slots, iteration count, loss scale) and the step are
  mirrored: every replica holds a copy of the same value;
- the factored gradient exchange (allreduce.py) keeps no state from one step to the next: which
  Dense layers it factors is chosen at each start from the batch per replica and the replica count
  of that start (the chief logs the choice), and the factors live for one step;
- the training and evaluation sums (steps.Sums) are per replica and deliberately not checkpointed:
  they cover the steps since the last log line, and a start begins them at zero;
- each worker reads its share of one global stream of examples (inputs.py). The checkpoint keeps
  the stream's position in examples, not in steps, so that the stream is shared out again among
  the workers now running and a resumed run goes on with the first example not yet trained on,
  whether or not its global batch is the one that wrote the checkpoint.
"""

from __future__ import annotations

import tensorflow as tf

UNKNOWN_WORKERS = 0  # a checkpoint written before the count was kept


class StreamPosition:
    def __init__(self, strategy: tf.distribute.Strategy, workers: int, global_batch_size: int):
        with strategy.scope():
            self.examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="examples_seen")
            self.written_by = tf.Variable(workers, dtype=tf.int64, trainable=False, name="written_by_workers")
        self._workers = workers
        self._batch = global_batch_size
        self._start = (0, 0)  # (step, examples) where this start began

    def checkpoint_items(self) -> dict:
        return {"examples_seen": self.examples, "written_by_workers": self.written_by}

    @property
    def variables(self) -> list:
        return [self.examples, self.written_by]

    def restored_without_position(self, step: int) -> None:
        """On the chief, after restoring a checkpoint that does not keep the position: the run
        that wrote it read step x the global batch examples, the batch taken to be this start's."""
        self.examples.assign(step * self._batch)
        self.written_by.assign(UNKNOWN_WORKERS)

    def begin(self, step: int) -> None:
        """On every worker once the restored values are shared: this start begins at `step`."""
        self._start = (step, int(self.examples.numpy()))

    @property
    def start_example(self) -> int:
        """The first example of the stream this start reads."""
        return self._start[1]

    def advance_to(self, step: int) -> None:
        """Before a save at `step`: the examples read since, and this start's worker count."""
        first_step, first_example = self._start
        self.examples.assign(first_example + (step - first_step) * self._batch)
        self.written_by.assign(self._workers)

    def describe_resume(self, workers_now: int) -> str:
        """What the resume line adds: the stream's position and, at another size, who wrote it."""
        text = f"example {self.start_example} of the training stream"
        written_by = int(self.written_by.numpy())
        if written_by == UNKNOWN_WORKERS:
            return text + " (step x global batch: the checkpoint does not keep it)"
        if written_by != workers_now:
            text += f", written by {written_by} workers, now {workers_now}"
        return text
