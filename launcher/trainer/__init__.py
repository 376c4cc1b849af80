"""The worker program: trains (or, as an evaluator task, evaluates) one task of a cluster.

`main` parses options without TensorFlow, loads the data, and only then imports it.
Every error ends as one line on stderr and an exit code; --debug adds the traceback. Under the
launcher, the error and its traceback also go to the task's error file (launcher/error_file.py).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from launcher.errors import EXIT_FAILED, EXIT_INTERRUPTED, MgpuError, UsageError


def main(argv: list[str] | None = None) -> int:
    from launcher.trainer import options

    started = time.time()
    argv = sys.argv[1:] if argv is None else list(argv)
    if hasattr(sys.stdout, "reconfigure"):  # the launcher reads our output line by line
        sys.stdout.reconfigure(line_buffering=True)
    # Until the options are parsed, a bare --debug anywhere asks for tracebacks.
    debug = "--debug" in argv
    try:
        try:
            opts = options.parse(argv)
        except options.ParserExit as done:
            return done.status
        debug = opts.debug
        return _run(opts, started)
    except MgpuError as exc:
        _record(exc, "error")
        if debug:
            traceback.print_exc()
        print(f"{options.PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: one line, and the traceback on request
        _record(exc, "exception")
        if debug:
            traceback.print_exc()
        print(f"{options.PROG}: internal error: {_one_line(exc)}"
              f"{'' if debug else ' (run with --debug for the traceback)'}", file=sys.stderr, flush=True)
        return EXIT_FAILED


def _record(exc: BaseException, exit: str) -> None:
    """Tell the launcher why this task fails, through its error file (when it gave one)."""
    from launcher import error_file  # imported only when failing: the trainer loads no more of the launcher

    error_file.write(exc, exit=exit)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _run(opts, started: float) -> int:
    from launcher.trainer import cluster

    info = cluster.resolve(opts.worker_hosts, opts.task_index)
    if info.is_evaluator and opts.model_dir is None:
        raise UsageError("an evaluator task needs --model-dir")
    from launcher.trainer.outdirs import check_output_dirs

    check_output_dirs({"--model-dir": opts.model_dir, "--export-dir": opts.export_dir})
    if not info.is_evaluator:  # contradictions with the cluster, before the slow import
        cluster.choose_strategy(opts.distribution_strategy, info.num_workers, num_gpus=0)
    from launcher.trainer import datasets  # numpy: only once the options are good
    arrays = datasets.load(opts.dataset, opts.data_dir)
    # Keep TensorFlow's C++ INFO/WARNING logs (after its start-up banner) out of the log.
    if opts.tf_log_level is not None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = str(opts.tf_log_level)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TensorFlow's Lite converter imports JAX, and Keras's image-gallery plots import matplotlib,
    # where they are installed, for conversions and plots the trainer never makes: together a
    # quarter of `import tensorflow`'s time, at every start and restart of every task. Marked
    # absent, they are skipped (both take the ImportError as "not installed").
    sys.modules.setdefault("jax", None)
    sys.modules.setdefault("matplotlib", None)
    from launcher.trainer import scratch
    scratch.use_own_folder()  # before TensorFlow's import: its autograph files go there
    from launcher.trainer import run
    return run.run(opts, info, arrays, started)

