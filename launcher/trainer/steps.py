"""The compiled train and eval loops (what orbit calls the Trainer and Evaluator).

One Python call runs many steps inside a tf.function, so the host does no per-step
work. Metrics accumulate in sync-on-read variables: updating them is local, and only
reading them (at log and eval time) costs a collective.
"""

from __future__ import annotations

import tensorflow as tf

from launcher.trainer.allreduce import AllReduceSettings, allreduce_gradients


class Sums:
    """Per-replica running sums of (loss, correct, count), summed over all replicas on read."""

    def __init__(self, strategy: tf.distribute.Strategy, name: str):
        with strategy.scope():
            self._var = tf.Variable(
                tf.zeros([3]), trainable=False, name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

    def add(self, loss_sum, correct, count) -> None:
        self._var.assign_add(tf.stack([loss_sum, correct, count]))

    def reset(self) -> None:
        self._var.assign(tf.zeros([3]))

    def result(self) -> dict[str, float]:
        """Collective: every worker must call it at the same point."""
        loss_sum, correct, count = (float(x) for x in self._var.read_value().numpy())
        count = max(count, 1.0)
        return {"loss": loss_sum / count, "accuracy": correct / count, "examples": count}


def _per_example(model, images, labels, training):
    logits = tf.cast(model(images, training=training), tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=labels.dtype), labels),
                      tf.float32)
    return losses, correct


class TrainLoop:
    def __init__(self, strategy, model, optimizer, step: tf.Variable, global_batch_size: int,
                 allreduce: AllReduceSettings, loss_scaling: bool, xla: bool):
        self.sums = Sums(strategy, "train_sums")
        variables = model.trainable_variables

        def forward_backward(images, labels):
            with tf.GradientTape() as tape:
                losses, correct = _per_example(model, images, labels, training=True)
                loss = tf.reduce_sum(losses) / global_batch_size
                if loss_scaling:
                    loss = optimizer.scale_loss(loss)
            grads = tape.gradient(loss, variables)
            return grads, tf.reduce_sum(losses), tf.reduce_sum(correct)

        if xla:
            # Only the computation is compiled; the all-reduce stays outside XLA.
            forward_backward = tf.function(forward_backward, jit_compile=True)

        def replica_step(images, labels):
            grads, loss_sum, correct = forward_backward(images, labels)
            grads = allreduce_gradients(grads, allreduce)
            optimizer.apply(grads, variables)
            self.sums.add(loss_sum, correct, tf.cast(tf.shape(labels)[0], tf.float32))

        @tf.function
        def train_steps(iterator, num_steps):
            for _ in tf.range(num_steps):
                strategy.run(replica_step, args=next(iterator))
                step.assign_add(1)
            return step.read_value()

        self._train_steps = train_steps

    def run(self, iterator, num_steps: int) -> int:
        """Run num_steps steps; returns the global step once they are done."""
        return int(self._train_steps(iterator, tf.constant(num_steps, tf.int32)))


class EvalLoop:
    def __init__(self, strategy, model, dataset, num_steps: int):
        self.sums = Sums(strategy, "eval_sums")
        self._dataset = dataset
        self._num_steps = num_steps

        def replica_step(images, labels, weights):
            losses, correct = _per_example(model, images, labels, training=False)
            self.sums.add(tf.reduce_sum(losses * weights), tf.reduce_sum(correct * weights),
                          tf.reduce_sum(weights))

        @tf.function
        def eval_steps(iterator, num_steps):
            for _ in tf.range(num_steps):
                strategy.run(replica_step, args=next(iterator))

        self._eval_steps = eval_steps

    def run(self) -> dict[str, float]:
        """Evaluate the current weights on the test set. Collective."""
        self.sums.reset()
        self._eval_steps(iter(self._dataset), tf.constant(self._num_steps, tf.int32))
        return self.sums.result()
