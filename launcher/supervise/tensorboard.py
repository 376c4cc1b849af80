"""TensorBoard event files of a run (`mgpu launch --tensorboard DIR`, spec `tensorboard:`), written
with tensorboardX (no TensorFlow needed) under DIR/mgpu/, a run of its own beside the program's. Only
this module imports tensorboardX, and only the supervisor of a run with the option imports this one.

Tags, each over wall time (the step is the second of the run):
- mgpu/goodput, mgpu/time_lost_s and mgpu/lost_s/<cause> (lost_time.CATEGORIES): the run's costs;
- mgpu/restarts: the restarts made (a scalar), and a text entry per restart with its cause and the
  task and host at fault;
- mgpu/hosts_in_use; mgpu/busy/<task>: each task's busy share (pace.py), "worker:1" as worker_1;
- mgpu/steps_per_s: where the program reports steps.
"""

from __future__ import annotations

import pathlib

from launcher.errors import UsageError
from launcher.supervise.lost_time import CATEGORIES

SUBDIR = "mgpu"
FLUSH_SECONDS = 10  # the writer's own flush; every sample is flushed too


class EventWriter:
    def __init__(self, folder: pathlib.Path, started: float):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise UsageError("--tensorboard needs tensorboardX: pip install tensorboardX "
                             "(or mgpu's extra: pip install 'mgpu[tensorboard]')") from None
        self.started = started
        self.path = folder / SUBDIR
        self._writer = SummaryWriter(logdir=str(self.path), flush_secs=FLUSH_SECONDS)

    def sample(self, sample: dict) -> None:
        """One of samples.py's samples: the figures it has, at its time."""
        at = sample["at"]
        step = int(at - self.started)
        scalar = self._scalar
        scalar("mgpu/hosts_in_use", sample.get("hosts"), step, at)
        scalar("mgpu/steps_per_s", sample.get("steps_per_s"), step, at)
        for task, share in (sample.get("busy") or {}).items():
            scalar(f"mgpu/busy/{tag_safe(task)}", share, step, at)
        costs = sample.get("costs") or {}
        scalar("mgpu/goodput", costs.get("goodput"), step, at)
        scalar("mgpu/time_lost_s", costs.get("time_lost_s"), step, at)
        for name in CATEGORIES:
            scalar(f"mgpu/lost_s/{name}", (costs.get("lost_s") or {}).get(name), step, at)
        scalar("mgpu/restarts", costs.get("restarts"), step, at)
        self._writer.flush()

    def restart(self, number: int, at: float, cause: str, task: str | None, host: str | None, detail: str) -> None:
        step = int(at - self.started)
        self._scalar("mgpu/restarts", number, step, at)
        who = f" ({task} on {host})" if task else (f" ({host})" if host else "")
        # Markdown: the text plugin renders it; the cause's detail is the program's words, quoted.
        self._writer.add_text("mgpu/restarts", f"restart {number}: {cause}{who}: `{detail[:500].replace('`', chr(39))}`",
                              step, walltime=at)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def _scalar(self, tag: str, value, step: int, at: float) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self._writer.add_scalar(tag, value, step, walltime=at)


def tag_safe(task: str) -> str:
    """A task's name in a tag: "worker:1" as "worker_1" (TensorBoard's tags take no colon)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task)[:100]
