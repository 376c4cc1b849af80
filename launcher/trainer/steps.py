"""The compiled train and eval loops (what orbit calls the Trainer and Evaluator).

One Python call runs many steps inside a tf.function, so the host does no per-step
work. Metrics accumulate in sync-on-read variables: updating them is local, and only
reading them (at log and eval time) costs a collective.

Each step also says how long this replica waited in the gradient exchange's collectives
(allreduce.py reads the host's clock around them, inside the graph): in a synchronous job a
worker that computes faster than another waits there for it, and the slowest waits least.
"""

from __future__ import annotations

import tensorflow as tf

from launcher.trainer.allreduce import AllReduceSettings, exchange_gradients, timed_allreduce_gradients


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
    return _loss_and_correct(model(images, training=training), labels)


def _loss_and_correct(logits, labels):
    logits = tf.cast(logits, tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=labels.dtype), labels),
                      tf.float32)
    return losses, correct


def _forward_recording(model, images, factored):
    """The training forward pass layer by layer; returns logits and, per factored layer,
    its (inputs, output) as tensors the tape can differentiate against."""
    h = images
    recorded = []
    for layer in model.layers:
        inputs = h
        h = layer(h, training=True)
        if any(layer is f for f in factored):
            recorded.append((inputs, h))
    return h, recorded


def replica_gradients(model, optimizer, global_batch_size: int, replicas: int,
                      allreduce: AllReduceSettings, factored: list, loss_scaling: bool, xla: bool):
    """timed_replica_gradients without the wait: the function returns (gradients, loss sum, correct)."""
    timed = timed_replica_gradients(model, optimizer, global_batch_size, replicas, allreduce, factored,
                                    loss_scaling, xla)
    return lambda images, labels: timed(images, labels)[:3]


def timed_replica_gradients(model, optimizer, global_batch_size: int, replicas: int,
                            allreduce: AllReduceSettings, factored: list, loss_scaling: bool, xla: bool):
    """A function of a replica's (images, labels), called in replica context, returning
    (gradients summed over all replicas in model.trainable_variables order, this replica's
    loss sum, its count of correct predictions, the seconds it waited in the exchange).

    The gradients are those of the global mean loss (scaled by the optimizer's loss scale
    with `loss_scaling`). `factored`: layers whose kernel gradients are rebuilt by
    exchange_gradients; every other gradient is all-reduced (or, with factors, all-gathered
    with them or right after them).
    """
    variables = model.trainable_variables
    kernels = [layer.kernel for layer in factored]
    # Gradients the tape computes; the factored kernels' come from the exchange.
    others = [v for v in variables if not any(v is k for k in kernels)]
    # Where each exchanged gradient goes in `variables`, which the optimizer gets whole.
    order = [_index_of(v, others + kernels) for v in variables]
    batch_per_replica = global_batch_size // replicas

    def scaled_loss(losses):
        loss = tf.reduce_sum(losses) / global_batch_size
        return optimizer.scale_loss(loss) if loss_scaling else loss

    def forward_backward(images, labels):
        with tf.GradientTape() as tape:
            losses, correct = _per_example(model, images, labels, training=True)
            loss = scaled_loss(losses)
        grads = tape.gradient(loss, variables)
        return grads, tf.reduce_sum(losses), tf.reduce_sum(correct)

    def forward_backward_factored(images, labels):
        with tf.GradientTape() as tape:
            logits, recorded = _forward_recording(model, images, factored)
            losses, correct = _loss_and_correct(logits, labels)
            loss = scaled_loss(losses)
        grads = tape.gradient(loss, others + [out for _, out in recorded])
        factors = [(inputs, d_out) for (inputs, _), d_out in zip(recorded, grads[len(others):])]
        return grads[:len(others)], factors, tf.reduce_sum(losses), tf.reduce_sum(correct)

    if xla:
        # Only the computation is compiled; the collectives stay outside XLA.
        forward_backward = tf.function(forward_backward, jit_compile=True)
        forward_backward_factored = tf.function(forward_backward_factored, jit_compile=True)

    def gradients(images, labels):
        if factored:
            # The exchange splits tensors by their sizes, so the batch must be static.
            images = tf.ensure_shape(images, [batch_per_replica, *images.shape[1:]])
            other_grads, factors, loss_sum, correct = forward_backward_factored(images, labels)
            summed, kernel_grads, waited = exchange_gradients(other_grads, factors, allreduce)
            exchanged = summed + kernel_grads
            return [exchanged[i] for i in order], loss_sum, correct, waited
        grads, loss_sum, correct = forward_backward(images, labels)
        summed, waited = timed_allreduce_gradients(grads, allreduce)
        return summed, loss_sum, correct, waited

    return gradients


class TrainLoop:
    def __init__(self, strategy, model, optimizer, step: tf.Variable, global_batch_size: int,
                 allreduce: AllReduceSettings, factored: list, loss_scaling: bool, xla: bool):
        """`factored`: layers whose kernel gradients are rebuilt by exchange_gradients."""
        self.sums = Sums(strategy, "train_sums")
        self.allreduce = allreduce
        self.factored = factored
        variables = model.trainable_variables
        gradients = timed_replica_gradients(model, optimizer, global_batch_size,
                                            strategy.num_replicas_in_sync, allreduce, factored,
                                            loss_scaling, xla)

        # Only the loops below need autograph (tf.range). What a replica step calls, Keras 3's layers,
        # losses and optimizers and the exchange, has no Python control flow on tensors (Keras 3
        # runs it on JAX too): converting it would cost tracing time at every start of every task.
        @tf.autograph.experimental.do_not_convert
        def replica_step(images, labels):
            grads, loss_sum, correct, waited = gradients(images, labels)
            optimizer.apply(grads, variables)
            self.sums.add(loss_sum, correct, tf.cast(tf.shape(labels)[0], tf.float32))
            return waited

        @tf.function
        def train_steps(iterator, num_steps):
            waited = tf.constant(0.0, tf.float64)
            for _ in tf.range(num_steps):
                # This worker's replicas wait side by side: their mean is the worker's wait.
                local = strategy.experimental_local_results(strategy.run(replica_step, args=next(iterator)))
                waited += tf.add_n(local) / len(local)
                step.assign_add(1)
            return step.read_value(), waited

        self._train_steps = train_steps

    def run(self, iterator, num_steps: int) -> tuple[int, float]:
        """Run num_steps steps; returns the global step once they are done, and the seconds
        these steps waited in the gradient exchange for the other workers."""
        step, waited = self._train_steps(iterator, tf.constant(num_steps, tf.int32))
        return int(step), float(waited)


def _index_of(variable, variables: list) -> int:
    return next(i for i, v in enumerate(variables) if v is variable)


class EvalLoop:
    def __init__(self, strategy, model, dataset, num_steps: int):
        self.sums = Sums(strategy, "eval_sums")
        self._dataset = dataset
        self._num_steps = num_steps

        @tf.autograph.experimental.do_not_convert  # as in TrainLoop
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
