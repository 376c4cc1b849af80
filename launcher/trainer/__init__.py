"""The worker program: trains (or, as an evaluator task, evaluates) one task of a cluster.

`main` parses options without TensorFlow, loads the data, and only then imports it.
"""

from __future__ import annotations

import os
import sys
import time

from launcher.errors import MgpuError, UsageError


def main(argv: list[str] | None = None) -> int:
    from launcher.trainer import cluster, options

    started = time.time()
    argv = sys.argv[1:] if argv is None else list(argv)
    if hasattr(sys.stdout, "reconfigure"):  # the launcher reads our output line by line
        sys.stdout.reconfigure(line_buffering=True)
    try:
        try:
            opts = options.parse(argv)
        except options.ParserExit as done:
            return done.status
        info = cluster.resolve(opts.worker_hosts, opts.task_index)
        if info.is_evaluator and opts.model_dir is None:
            raise UsageError("an evaluator task needs --model-dir")
        if not info.is_evaluator:  # contradictions with the cluster, before the slow import
            cluster.choose_strategy(opts.distribution_strategy, info.num_workers, num_gpus=0)
        from launcher.trainer import datasets  # numpy: only once the options are good
        arrays = datasets.load(opts.dataset, opts.data_dir)
        # Keep TensorFlow's C++ INFO/WARNING logs (after its start-up banner) out of the log.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from launcher.trainer import run
        return run.run(opts, info, arrays, started)
    except MgpuError as exc:
        print(f"{options.PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
