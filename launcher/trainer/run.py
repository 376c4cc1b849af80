"""One training task from start to finish: strategy, state, schedule, results."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import NoReturn

import keras
import tensorflow as tf

from launcher import protocol
from launcher.errors import EXIT_FAILED, EXIT_OK, MgpuError
from launcher.trainer import builders, evaluator, export, outdirs, scratch
from launcher.trainer import strategy as strategy_lib
from launcher.trainer.allreduce import describe_exchange
from launcher.trainer.checkpoints import Checkpointer, broadcast_from_first_replica
from launcher.trainer.cluster import ClusterInfo
from launcher.trainer.controller import Controller, Outcome
from launcher.trainer.fingerprints import gather_fingerprints, local_fingerprints
from launcher.trainer.schedule import Schedule
from launcher.trainer.datasets import Arrays
from launcher.trainer.options import PROG, TrainOptions
from launcher.trainer.planned_size import choose_global_batch
from launcher.trainer.preemption import Preempted, PreemptionWatcher
from launcher.trainer.reporting import Reporter, log
from launcher.trainer.stream_position import StreamPosition


def run(opts: TrainOptions, info: ClusterInfo, arrays: Arrays, started: float) -> int:
    """Returns an exit code; a training task that ends cleanly ends the process itself."""
    try:
        if info.is_evaluator:
            return evaluator.run(opts, arrays)
        code = train(opts, info, arrays, started)
    except tf.errors.OpError as exc:
        # Chained: the error file's traceback keeps TensorFlow's whole message (which names the
        # tasks that stopped sending heartbeats, also when its C++ log records are turned off).
        raise MgpuError(f"{info.name}: TensorFlow {type(exc).__name__}: {telling_line(exc.message or str(exc))}") from exc
    leave(info, code)


def telling_line(message: str) -> str:
    """The line of a TensorFlow error message that says what went wrong: not the "Graph execution
    error:" heading, nor the "Detected at node ... defined at" line and its (indented) frames."""
    lines = message.strip().splitlines()
    for line in lines:
        if line.strip() and not line[:1].isspace() and not line.startswith(("Graph execution error", "Detected at node")):
            return line.strip()
    return lines[0].strip() if lines else ""


def leave(info: ClusterInfo, code: int) -> NoReturn:
    """End the process once every worker has passed the final barrier.

    Called where training ends, not after returning from it: unwinding the training frames
    destroys TensorFlow objects (iterators, collectives) that wait seconds for peers that have
    already left. The chief hosts the coordination service, so it leaves last: a worker whose
    heartbeat finds it gone logs errors.
    """
    if info.is_chief:
        wait_until_closed(info.peer_addresses(), timeout=PEER_EXIT_TIMEOUT)
    sys.stdout.flush()
    sys.stderr.flush()
    scratch.remove()  # os._exit runs no atexit handler
    os._exit(code)


PEER_EXIT_TIMEOUT = 10.0


def wait_until_closed(addresses: list[str], timeout: float) -> None:
    """Return once no peer accepts connections on its server port any more (or at the timeout)."""
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending and time.monotonic() < deadline:
        pending = [address for address in pending if _accepts_connections(address)]
        if pending:
            time.sleep(0.05)


def _accepts_connections(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def train(opts: TrainOptions, info: ClusterInfo, arrays: Arrays, started: float) -> int:
    gpus = strategy_lib.configure_runtime(opts)
    strategy = strategy_lib.build(opts, info, len(gpus))
    strategy_lib.barrier(strategy)  # every worker has joined the cluster
    log(protocol.READY_LINE)
    replicas = strategy.num_replicas_in_sync
    batch_choice = choose_global_batch(opts, replicas, info.num_workers, info.planned_workers)
    batch = batch_choice.size
    if info.is_chief:
        if batch_choice.note:
            log(batch_choice.note)
        log(f"{type(strategy).__name__}: {info.num_workers} worker(s), {replicas} replica(s), "
            f"global batch {batch}, model {opts.model}, dataset {opts.dataset}, "
            f"precision {keras.mixed_precision.global_policy().name}, xla {opts.xla}")

    state = builders.train_state(opts, strategy)
    position = StreamPosition(strategy, info.num_workers, batch)
    checkpointer = _restore(opts, info, strategy, state, position)
    start_step = int(state.step.numpy())
    train_data = builders.train_data(strategy, arrays, seed=opts.seed, start_example=position.start_example,
                                     global_batch_size=batch)
    train_loop = builders.train_loop(opts, strategy, state, batch, len(gpus))
    if info.is_chief:
        log(f"gradient exchange: {describe_exchange(train_loop.allreduce, train_loop.factored)}")
    eval_loop = builders.eval_loop(strategy, state.model, arrays, batch, opts.eval_steps)
    reporter = Reporter(info.is_chief, opts.model_dir, opts.train_steps)
    watcher = PreemptionWatcher(strategy)
    controller = Controller(
        schedule=Schedule(opts.train_steps, opts.steps_per_loop, opts.log_every, opts.eval_every,
                          opts.checkpoint_every, opts.stop_at_accuracy),
        global_batch_size=batch, train=train_loop, evaluate=eval_loop,
        iterator=iter(train_data), checkpointer=checkpointer, watcher=watcher, reporter=reporter)
    try:
        outcome = controller.train_and_evaluate(start_step)
    except Preempted as preempted:
        # The watcher stays installed until the process ends: the launcher stops the other
        # tasks with SIGTERM as soon as one exits 42, and that must not turn this exit 42
        # into a death by signal while the chief waits for its peers.
        reporter.close()
        strategy_lib.final_barrier(strategy)
        log(f"{info.name}: preempted; checkpoint saved at step {preempted.step}")
        leave(info, protocol.EXIT_PREEMPTED)
    watcher.close()
    # The stream's position is checked with the weights: workers that read it from different places
    # would end with the same weights and have trained on other examples than the ones they say.
    return _finish(opts, info, strategy, state.model, [*state.model.weights, *position.variables], outcome,
                   reporter, started)


def _restore(opts: TrainOptions, info: ClusterInfo, strategy, state: builders.TrainState,
             position: StreamPosition) -> Checkpointer:
    """Restore the latest checkpoint on the chief and hand its state to every worker."""
    checkpointer = Checkpointer(dict(model=state.model, optimizer=state.optimizer, step=state.step),
                                opts.model_dir, info.is_chief, info.worker_index, opts.keep_checkpoints,
                                added=position.checkpoint_items(), before_save=position.advance_to)
    restored, with_position = checkpointer.restore_latest()
    if restored and not with_position:
        position.restored_without_position(int(state.step.numpy()))
    broadcast_from_first_replica(strategy, [*state.variables, *position.variables])
    position.begin(int(state.step.numpy()))
    if restored and info.is_chief:
        log(f"resumed from {restored} at step {int(state.step.numpy())}, "
            f"{position.describe_resume(info.num_workers)}")
    return checkpointer


def _finish(opts: TrainOptions, info: ClusterInfo, strategy, model, agreed: list, outcome: Outcome,
            reporter: Reporter, started: float) -> int:
    """Check that every replica ended with the same `agreed` variables (the weights); the chief
    writes the results."""
    fingerprints = gather_fingerprints(strategy, local_fingerprints(strategy, agreed))
    if info.is_chief:
        if opts.model_dir is not None:
            outdirs.write_json(os.path.join(opts.model_dir, "metrics.json"), {
                "loss": outcome.final_eval["loss"],
                "accuracy": outcome.final_eval["accuracy"],
                "global_step": outcome.step,
                "wall_time_s": round(time.time() - started, 3),
                "num_replicas": strategy.num_replicas_in_sync,
                "examples_per_sec": round(outcome.examples_per_sec, 2),
                "replica_fingerprints": fingerprints,
            })
        if opts.export_dir is not None:
            export.export(model, opts.model, opts.export_dir)
            log(f"exported SavedModel to {opts.export_dir}")
        log(f"done step={outcome.step} accuracy={outcome.final_eval['accuracy']:.4f} "
            f"examples/sec={outcome.examples_per_sec:.1f} fingerprints={','.join(fingerprints)}")
    reporter.close()
    strategy_lib.final_barrier(strategy)  # nobody exits while another still needs the cluster
    if len(set(fingerprints)) > 1:
        print(f"{PROG}: error: replicas ended with different weights or training-stream positions: fingerprints "
              f"{', '.join(fingerprints)}", file=sys.stderr)
        leave(info, EXIT_FAILED)
    leave(info, EXIT_OK)
