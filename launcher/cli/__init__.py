"""The command line: click commands, option types, and the typed options they hand on.

Only this package imports click. It never imports TensorFlow or numpy.
"""

from launcher.cli import commands, hosts, k8s, report, runs, stacks, tf_config  # noqa: F401 - registers the commands on the group
from launcher.cli.main import cli, main

__all__ = ["cli", "commands", "hosts", "k8s", "main", "report", "runs", "stacks", "tf_config"]
