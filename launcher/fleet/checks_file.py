"""The first start's host checks' table kept in the run folder as checks.json, what `mgpu check
--json` prints for the run's hosts, so that `mgpu report` shows it. The run folder is made here
where no stage made it yet (as the --setup's stage does, for its logs) and handed to supervision
with the fleet. A table that cannot be written (a full disk) is said once; the run goes on."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

from launcher.preflight.check_json import bounded
from launcher.supervise.rundir import CHECKS, make_run_dir

if TYPE_CHECKING:
    from launcher.fleet.stages import Hosts


def keep_checks(fleet: "Hosts", document: dict, notice: Callable[[str], None]) -> None:
    if fleet.run_dir is None:
        fleet.run_dir = make_run_dir(fleet.options.supervise)
    data = bounded(document).encode()
    try:
        fd = fleet.run_dir.create(CHECKS)
    except OSError as e:
        notice(f"warning: cannot write {CHECKS} in {fleet.run_dir.path}: {e.strerror or e}; "
               f"the run's report shows no host checks")
        return
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        notice(f"warning: cannot write {CHECKS} in {fleet.run_dir.path}: {e.strerror or e}; "
               f"the run's report shows no host checks")
    finally:
        os.close(fd)
