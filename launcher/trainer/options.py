"""Command-line options of the worker program.

Parsing and validation import neither TensorFlow nor numpy, so `--help` and bad
options answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses

from launcher.errors import UsageError
from launcher.config.addresses import format_address, parse_endpoint_list

PROG = "mgpu train"

STRATEGIES = ("auto", "off", "one_device", "mirrored", "multi_worker_mirrored")
ALL_REDUCE = ("auto", "ring", "nccl")
ALLREDUCE_DTYPES = ("float32", "float16", "bfloat16")
GRADIENT_EXCHANGES = ("auto", "allreduce", "factors")
FACTOR_DTYPES = ("int8", "bfloat16", "float32")
FACTOR_GATHERS = ("together", "early")
MIXED_PRECISION = ("mixed_bfloat16", "mixed_float16")
MODELS = ("cnn", "small")
DATASETS = ("mnist", "fashion_mnist", "synthetic")
OPTIMIZERS = ("adam", "sgd")

DEFAULT_BATCH_SIZE_PER_REPLICA = 128


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    # cluster and strategy
    worker_hosts: tuple[str, ...] | None
    task_index: int | None
    distribution_strategy: str
    all_reduce: str
    collective_timeout: float | None
    allreduce_dtype: str
    bytes_per_pack: int
    gradient_exchange: str
    factor_dtype: str
    factor_gather: str
    # devices and numerics
    mixed_precision: str | None
    xla: bool
    threads: int | None
    # model, data, optimizer
    model: str
    dataset: str
    data_dir: str | None
    batch_size_per_replica: int | None
    global_batch_size: int | None
    optimizer: str
    learning_rate: float
    seed: int
    # loop
    train_steps: int
    steps_per_loop: int
    log_every: int
    eval_every: int | None
    eval_steps: int | None
    stop_at_accuracy: float | None
    # outputs
    model_dir: str | None
    checkpoint_every: int | None
    keep_checkpoints: int
    export_dir: str | None
    evaluator_timeout: float
    # diagnostics
    debug: bool = False
    tf_log_level: int | None = None  # TensorFlow's C++ log threshold; None: 2, or TF_CPP_MIN_LOG_LEVEL


class ParserExit(Exception):
    """--help (or --version) was answered; exit with `status`."""

    def __init__(self, status: int):
        self.status = status


class _Parser(argparse.ArgumentParser):
    """An argparse parser that reports errors as UsageError instead of exiting."""

    def error(self, message):
        raise UsageError(message)

    def exit(self, status=0, message=None):
        if message:
            self._print_message(message)
        raise ParserExit(status)


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        if not text.isascii():  # int() also reads '٣' and '²'-like digits of other scripts
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _positive_float(text: str) -> float:
    try:
        if not text.isascii():  # float() also reads digits of other scripts
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def _host_list(text: str) -> tuple[str, ...]:
    try:
        endpoints = parse_endpoint_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    for endpoint in endpoints:
        if endpoint.port is None or endpoint.user:
            raise argparse.ArgumentTypeError(f"expected host:port, got {str(endpoint)!r}")
    return tuple(format_address(endpoint.host, endpoint.port) for endpoint in endpoints)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where there is one and the help text does not already say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Train an image classifier with tf.distribute, one process per worker. "
        "The cluster comes from TF_CONFIG (or --worker-hosts/--task-index).",
        formatter_class=_HelpFormatter,
    )
    _add_cluster_options(parser.add_argument_group("cluster and strategy"))
    _add_device_options(parser.add_argument_group("devices"))
    _add_model_options(parser.add_argument_group("model and data"))
    _add_loop_options(parser.add_argument_group("training loop"))
    _add_output_options(parser.add_argument_group("outputs"))
    parser.add_argument("--debug", action="store_true", help="show the traceback of errors")
    parser.add_argument("--tf-log-level", type=int, choices=range(4), default=None, metavar="{0,1,2,3}",
                        help="TensorFlow's C++ logs shown: 0 all, 1 no INFO, 2 errors only, 3 none "
                             "(default: TF_CPP_MIN_LOG_LEVEL, else 2)")
    return parser


def _add_cluster_options(g) -> None:
    g.add_argument("--worker-hosts", type=_host_list, default=None,
                   help="comma-separated host:port of all workers; used only when TF_CONFIG is unset")
    g.add_argument("--task-index", type=_non_negative_int, default=None,
                   help="this worker's position in --worker-hosts")
    g.add_argument("--distribution-strategy", choices=STRATEGIES, default="auto",
                   help="auto: multi-worker when the cluster has several workers, "
                   "mirrored with several local GPUs, else the default strategy")
    g.add_argument("--all-reduce", choices=ALL_REDUCE, default="auto",
                   help="collective implementation (nccl needs GPUs)")
    g.add_argument("--collective-timeout", type=_positive_float, default=None,
                   help="seconds before a collective operation gives up")
    g.add_argument("--allreduce-dtype", choices=ALLREDUCE_DTYPES, default="float32",
                   help="dtype gradients travel in during the all-reduce (float16: scaled by 256 "
                   "so small gradients survive)")
    g.add_argument("--bytes-per-pack", type=_non_negative_int, default=0,
                   help="pack gradients into all-reduce chunks of this many bytes (0: one pack)")
    g.add_argument("--gradient-exchange", choices=GRADIENT_EXCHANGES, default="auto",
                   help="allreduce: all-reduce every gradient; factors: all-gather every gradient "
                   "and the inputs and output gradients of each Dense layer without "
                   "activation, whose kernel gradient each worker then rebuilds with a matmul; "
                   "auto: factors for the Dense layers where that moves fewer bytes, with 2 or "
                   "more replicas on CPUs, else allreduce (always on workers with GPUs)")
    g.add_argument("--factor-dtype", choices=FACTOR_DTYPES, default="int8",
                   help="dtype of the factors on the wire: int8 (a scale per row) and bfloat16 are "
                   "rebuilt in bfloat16, float32 in float32 (exact up to rounding)")
    g.add_argument("--factor-gather", choices=FACTOR_GATHERS, default="together",
                   help="early: the factors go on the wire in an all-gather of their own as soon "
                   "as the Dense layers' output gradients exist, while the layers below still "
                   "back-propagate; together: one all-gather of everything after the backward pass")


def _add_device_options(g) -> None:
    g.add_argument("--mixed-precision", choices=MIXED_PRECISION, default=None,
                   help="Keras mixed-precision policy (default: float32)")
    g.add_argument("--xla", action="store_true", help="compile the forward and backward pass with XLA")
    g.add_argument("--threads", type=_positive_int, default=None,
                   help="intra- and inter-op threads (default: TF_NUM_INTRAOP_THREADS / "
                   "TF_NUM_INTEROP_THREADS, else TensorFlow's choice)")


def _add_model_options(g) -> None:
    g.add_argument("--model", choices=MODELS, default="cnn",
                   help="cnn: 2 conv + dense 1024 + dropout (3.27M params); small: for quick tests")
    g.add_argument("--dataset", choices=DATASETS, default="fashion_mnist", help="what to train on")
    g.add_argument("--data-dir", default=None,
                   help="directory with the four IDX .gz files; without it they are downloaded "
                   "once into ~/.cache/mgpu/datasets/<name>")
    batch = g.add_mutually_exclusive_group()
    batch.add_argument("--batch-size-per-replica", type=_positive_int, default=None,
                       help=f"examples per replica per step (default {DEFAULT_BATCH_SIZE_PER_REPLICA})")
    batch.add_argument("--global-batch-size", type=_positive_int, default=None,
                       help="examples per step over all replicas; must divide by the replica count")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="sgd has momentum 0.9")
    g.add_argument("--learning-rate", type=_positive_float, default=1e-3, help="optimizer step size")
    g.add_argument("--seed", type=_non_negative_int, default=42,
                   help="seed of weight initialisation and data order")


def _add_loop_options(g) -> None:
    g.add_argument("--train-steps", type=_positive_int, default=1000, help="training steps in all")
    g.add_argument("--steps-per-loop", type=_positive_int, default=10,
                   help="steps run per call into TensorFlow; preemption is checked between calls")
    g.add_argument("--log-every", type=_positive_int, default=100, help="steps between log lines")
    g.add_argument("--eval-every", type=_positive_int, default=None,
                   help="steps between evaluations (default: only at the end)")
    g.add_argument("--eval-steps", type=_positive_int, default=None,
                   help="batches per evaluation (default: the whole test set)")
    g.add_argument("--stop-at-accuracy", type=_fraction, default=None,
                   help="stop once an evaluation reaches this accuracy")


def _add_output_options(g) -> None:
    g.add_argument("--model-dir", default=None,
                   help="checkpoints, TensorBoard summaries and metrics.json (on the chief's host)")
    g.add_argument("--checkpoint-every", type=_positive_int, default=None,
                   help="steps between checkpoints (default: at evaluations and at the end)")
    g.add_argument("--keep-checkpoints", type=_positive_int, default=5, help="how many recent checkpoints to keep")
    g.add_argument("--export-dir", default=None,
                   help="the chief exports a SavedModel here at the end")
    g.add_argument("--evaluator-timeout", type=_positive_float, default=1800.0,
                   help="an evaluator task stops after this many seconds without a new checkpoint")


def parse(argv: list[str]) -> TrainOptions:
    """Parse and validate; raises UsageError with a one-line message."""
    ns = build_parser().parse_args(argv)
    if (ns.worker_hosts is None) != (ns.task_index is None):
        raise UsageError("--worker-hosts and --task-index go together")
    if ns.worker_hosts is not None and ns.task_index >= len(ns.worker_hosts):
        raise UsageError(
            f"--task-index {ns.task_index} is out of range for {len(ns.worker_hosts)} worker hosts"
        )
    if ns.checkpoint_every is not None and ns.model_dir is None:
        raise UsageError("--checkpoint-every needs --model-dir")
    return TrainOptions(**vars(ns))


def global_batch_size(opts: TrainOptions, replicas: int) -> int:
    """Examples per step over all replicas; a size that does not divide is a usage error."""
    if opts.global_batch_size is None:
        return (opts.batch_size_per_replica or DEFAULT_BATCH_SIZE_PER_REPLICA) * replicas
    size = opts.global_batch_size
    if size % replicas:
        raise UsageError(f"--global-batch-size {size} does not divide among {replicas} replicas; "
                         f"use {nearest_multiple(size, replicas)}")
    return size


def nearest_multiple(size: int, replicas: int) -> int:
    """The multiple of `replicas` nearest `size` (the smaller of two as near), never 0."""
    below = size // replicas * replicas
    return below if below and size - below <= below + replicas - size else below + replicas
