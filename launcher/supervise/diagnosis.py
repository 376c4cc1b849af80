"""What task output means: the one place the supervisor learns TensorFlow's log wording."""

from __future__ import annotations

import re

# What TensorFlow's gRPC server prints when its port is taken (TF 2.21), and the
# classic wording of older releases and other servers.
_NO_ADDRESS = re.compile(r"No address added out of total \d+ resolved for '[^']*?:(\d+)'")
_BIND_FAILURE = re.compile(r"Address already in use|Failed to bind|Could not start gRPC server")



def bind_failure(line: str) -> int | None:
    """The port a line of task output says could not be bound: its number, or 0
    when the line reports a bind failure without naming the port; None otherwise."""
    match = _NO_ADDRESS.search(line)
    if match:
        return int(match.group(1))
    if _BIND_FAILURE.search(line):
        return 0
    return None
