"""The built-in trainer (launcher.trainer) with TensorFlow's coordination service giving up on a
silent task after MILLISECONDS instead of its default 10 s: a task found frozen fails its peer in
the same words, seconds sooner. TensorFlow has no setting of its own for it outside the program,
so its configuration call is wrapped once its module loads, which leaves the trainer's own order
of imports as it is (the environment it sets before TensorFlow loads).

Usage: python short_heartbeat_trainer.py MILLISECONDS TRAINER-OPTIONS...
"""

import importlib.abc
import importlib.machinery
import sys

from launcher.trainer import main

heartbeat_ms = int(sys.argv.pop(1))
CONTEXT_MODULE = "tensorflow.python.eager.context"


def shorten_heartbeat(context) -> None:
    configure = context.Context.configure_coordination_service

    def configure_with_short_heartbeat(self, *args, **kwargs):
        kwargs["heartbeat_timeout_in_ms"] = heartbeat_ms
        return configure(self, *args, **kwargs)

    context.Context.configure_coordination_service = configure_with_short_heartbeat


class ContextFinder(importlib.abc.MetaPathFinder):
    """Finds TensorFlow's eager context module as the path finder would, and wraps it once loaded."""

    def find_spec(self, name, path, target=None):
        if name != CONTEXT_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        load = spec.loader.exec_module

        def load_and_shorten(module):
            load(module)
            shorten_heartbeat(module)

        spec.loader.exec_module = load_and_shorten
        return spec


sys.meta_path.insert(0, ContextFinder())
sys.exit(main())
