"""The quarantine read in before a run is planned: each quarantined host's tasks on a spare where
one is given (a changed set of hosts, which then goes through the planner), with a warning for each
quarantined host (config/quarantine.py says what is done; host/quarantine_file.py keeps the file)."""

from __future__ import annotations

import sys
import time

from launcher.config import quarantine
from launcher.config.spec import ClusterSpec


def warn(text: str) -> None:
    from launcher.supervise.console_text import console_safe

    print(f"mgpu: warning: {console_safe(text)}", file=sys.stderr, flush=True)


def avoiding_quarantined(spec: ClusterSpec, duration: float, slurm: bool = False) -> ClusterSpec:
    """The spec with quarantined hosts avoided, warned about on stderr; as it is where `duration` is
    0 (--quarantine 0: the quarantine is neither read nor written). Under Slurm the allocation says
    where tasks run: a quarantined node is only warned about."""
    if not duration:
        return spec
    from launcher.host.names import local_host_names
    from launcher.host.quarantine_file import QuarantineFile

    entries = QuarantineFile(warn=warn).entries()
    if not entries:
        return spec
    spec, warnings = quarantine.avoiding(spec, quarantine.in_force(entries, time.time()),
                                         local_host_names(), replace=not slurm)
    for text in warnings:
        warn(text)
    return spec
