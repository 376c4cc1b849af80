"""Compiles the frameworks the tests start, once, before the tests start them.

`make test` runs with PYTHONPYCACHEPREFIX set (see the Makefile), so that the first process to import
a module caches its bytecode for every later one. At the start of the suite, though, each pytest
process starts a framework at the same moment, and each one compiles it from source for itself
(measured here: importing TensorFlow 8.6 CPU-s compiled and 3.0 cached; tf_keras 11.7 and 3.5;
Lightning 9.5 and 3.6). Here two processes, one per core, import them all once.

Usage: python tests/cache_bytecode.py   (with the environment `make test` gives pytest)
"""

from __future__ import annotations

import os
import subprocess
import sys

# Two groups of about the same cost; Keras 3 once with each backend the tests use.
GROUPS = (
    ({}, ("tensorflow", "tf_keras", "keras")),
    ({"KERAS_BACKEND": "jax"}, ("lightning", "keras", "tensorboardX")),
)
IMPORT = (
    "import importlib, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "    except ImportError:\n"
    "        pass  # not installed: nothing of it to cache\n"
)
TIMEOUT = 600  # seconds: a cold import of all of them takes about ten


def main() -> int:
    processes = [subprocess.Popen([sys.executable, "-c", IMPORT, *names], env={**os.environ, **env},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for env, names in GROUPS]
    for proc in processes:
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # Not a check of the frameworks: the tests that start one say what is wrong with it.
    return 0


if __name__ == "__main__":
    sys.exit(main())
