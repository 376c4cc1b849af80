"""Checks before anything starts: `mgpu check`, the probe it runs on every host, exposure warnings.

Starts no task; a failed check stops the launch before any task runs.
"""
