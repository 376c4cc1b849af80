"""What the policy is fed: the events of an attempt, each with the time it was seen (policy.py)."""

from __future__ import annotations

import dataclasses
from typing import Union


@dataclasses.dataclass(frozen=True)
class TaskEnded:
    name: str
    returncode: int  # negative: ended by that signal


@dataclasses.dataclass(frozen=True)
class ReadyLineSeen:
    name: str


@dataclasses.dataclass(frozen=True)
class JoinSeen:
    """A probe found the task joined (listening on its port, or connected to the coordinator)."""
    name: str


@dataclasses.dataclass(frozen=True)
class OutputSeen:
    name: str
    at: float  # when its last bytes were read


@dataclasses.dataclass(frozen=True)
class CpuSeen:
    name: str
    cpu_seconds: float  # used by its processes in all


@dataclasses.dataclass(frozen=True)
class SignalReceived:
    signum: int


Event = Union[TaskEnded, ReadyLineSeen, JoinSeen, OutputSeen, CpuSeen, SignalReceived]
