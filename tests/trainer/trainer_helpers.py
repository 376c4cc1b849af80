"""Start real trainer processes for the tests, and always clean them up."""

from __future__ import annotations

import json
import os
import re
import pathlib
import subprocess
import sys
import time

from launcher.host.ports import pick_free_ports
from launching import REPO

# TensorFlow's C++ log, and what `python -X importtime` writes.
_TF_LOG = re.compile(r"^[IWEF]\d{4} |^To enable the following instructions|^import time: ")

# Tiny and exactly reproducible: small model (no dropout), synthetic data, one thread.
FAST = ["--model", "small", "--dataset", "synthetic", "--threads", "1"]


def cluster_configs(num_workers: int, evaluator: bool = False) -> list[dict]:
    """TF_CONFIG for each worker (and the evaluator last), on free loopback ports."""
    addresses = [f"127.0.0.1:{p}" for p in pick_free_ports(num_workers)]
    configs = [{"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
               for i in range(num_workers)]
    if evaluator:
        configs.append({"cluster": {"worker": addresses}, "task": {"type": "evaluator", "index": 0}})
    return configs


class Trainer:
    """One `python -m launcher.trainer` process (or `program`, a script and its first arguments, which
    runs the trainer) with its output in a log file."""

    def __init__(self, args: list[str], log_path: pathlib.Path, tf_config: dict | None = None,
                 python_options: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 program: tuple[str, ...] = ("-m", "launcher.trainer")):
        env = {**os.environ, **(env or {})}
        env.pop("TF_CONFIG", None)
        for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
            env.pop(name, None)
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, *python_options, *program, *args],
                                     cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def imported(self) -> set[str]:
        """The modules the process imported or tried to, from the lines of `python -X importtime`
        (python_options)."""
        return {line.rsplit("|", 1)[1].strip() for line in self.output().splitlines()
                if line.startswith("import time: ") and line.count("|") == 2}

    def lines(self) -> list[str]:
        """The program's own lines, without TensorFlow's C++ log noise."""
        return [line for line in self.output().splitlines()
                if line and not _TF_LOG.match(line) and not line.startswith("WARNING: All log")]

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def wait_all(trainers: list[Trainer], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [t.wait(max(1.0, deadline - time.monotonic())) for t in trainers]
    finally:
        for t in trainers:
            t.close()


def read_json(path: pathlib.Path) -> dict:
    with open(path) as f:
        return json.load(f)

