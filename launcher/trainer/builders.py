"""The model, optimizer, loops and input pipelines of a run, built from its options.

The training task, the evaluator task and the benchmarks all build them here, so they
run the same model, gradient exchange and input pipeline.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from launcher.trainer import inputs, models, optimizers
from launcher.trainer import strategy as strategy_lib
from launcher.trainer.allreduce import AllReduceSettings, choose_factored_layers
from launcher.trainer.datasets import Arrays
from launcher.trainer.options import TrainOptions
from launcher.trainer.steps import EvalLoop, TrainLoop


@dataclasses.dataclass(frozen=True)
class TrainState:
    """What a checkpoint holds and what every worker must agree on."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    step: tf.Variable

    @property
    def variables(self) -> list:
        return [*self.model.variables, *self.optimizer.variables, self.step]


def loss_scaling(opts: TrainOptions) -> bool:
    return opts.mixed_precision == "mixed_float16"


def train_state(opts: TrainOptions, strategy: tf.distribute.Strategy) -> TrainState:
    """A freshly initialised model (seeded by --seed), its optimizer and a step counter at 0."""
    keras.utils.set_random_seed(opts.seed)
    with strategy.scope():
        model = models.build(opts.model)
        optimizer = optimizers.build(opts.optimizer, opts.learning_rate,
                                     loss_scaling=loss_scaling(opts))
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    return TrainState(model, optimizer, step)


def allreduce_settings(opts: TrainOptions, num_gpus: int) -> AllReduceSettings:
    return AllReduceSettings(opts.allreduce_dtype, strategy_lib.communication_options(opts, num_gpus),
                             opts.gradient_exchange, opts.factor_dtype, opts.factor_gather,
                             gpus=num_gpus)


def train_loop(opts: TrainOptions, strategy: tf.distribute.Strategy, state: TrainState,
               global_batch_size: int, num_gpus: int) -> TrainLoop:
    """The compiled training steps with the gradient exchange the options ask for."""
    allreduce = allreduce_settings(opts, num_gpus)
    replicas = strategy.num_replicas_in_sync
    factored = choose_factored_layers(allreduce, state.model, global_batch_size // replicas, replicas)
    return TrainLoop(strategy, state.model, state.optimizer, state.step, global_batch_size,
                     allreduce, factored, loss_scaling=loss_scaling(opts), xla=opts.xla)


def train_data(strategy: tf.distribute.Strategy, arrays: Arrays, *, seed: int, start_example: int,
               global_batch_size: int):
    """The distributed training set, from example `start_example` of its seeded order on."""
    return strategy.distribute_datasets_from_function(
        lambda ctx: inputs.train_dataset(arrays.train_images, arrays.train_labels, seed=seed,
                                         start_example=start_example, global_batch_size=global_batch_size,
                                         input_context=ctx))


def eval_loop(strategy: tf.distribute.Strategy, model: keras.Model, arrays: Arrays,
              global_batch_size: int, max_steps: int | None) -> EvalLoop:
    """Evaluation of `model` on the test set (at most `max_steps` batches; None: all of it)."""
    num_steps = inputs.eval_steps(len(arrays.test_labels), global_batch_size, max_steps)
    data = strategy.distribute_datasets_from_function(
        lambda ctx: inputs.eval_dataset(arrays.test_images, arrays.test_labels, steps=num_steps,
                                        global_batch_size=global_batch_size, input_context=ctx))
    return EvalLoop(strategy, model, data, num_steps)
