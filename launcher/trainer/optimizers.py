"""Keras optimizers that apply gradients already all-reduced by allreduce_gradients."""

from __future__ import annotations

import keras

_KINDS = {
    "adam": lambda lr: keras.optimizers.Adam(learning_rate=lr),
    "sgd": lambda lr: keras.optimizers.SGD(learning_rate=lr, momentum=0.9),
}


def build(kind: str, learning_rate: float, loss_scaling: bool) -> keras.optimizers.Optimizer:
    """Create inside strategy.scope(). `loss_scaling` wraps it for mixed_float16."""
    optimizer = _KINDS[kind](learning_rate)
    _skip_builtin_allreduce(optimizer)
    if loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _skip_builtin_allreduce(optimizer) -> None:
    # Keras' TensorFlow optimizer sums gradients over replicas inside apply(); ours
    # arrive summed already, and summing twice would double the traffic and the step.
    if not hasattr(optimizer, "_all_reduce_sum_gradients"):
        raise RuntimeError(
            "this Keras version has no TFOptimizer._all_reduce_sum_gradients; "
            "the trainer cannot keep gradients from being all-reduced twice"
        )
    optimizer._all_reduce_sum_gradients = lambda grads_and_vars: list(grads_and_vars)
