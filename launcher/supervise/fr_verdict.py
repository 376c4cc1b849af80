"""PyTorch's flight recorder analyzer's answer (`torch.distributed.flight_recorder.fr_trace`, run by
fr_analyze.py with the tasks' Python), read: which ranks did not join which collective, named as
mgpu's tasks. Pure: no I/O.

The analyzer's output is untrusted text (it prints what the tasks' own dumps hold): it is read
bounded in size, each field is checked (ranks are numbers the job has, names are cut and escaped),
and only what is recognised is kept."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from launcher.supervise.console_text import console_safe

OUTPUT_LIMIT = 1 << 20  # bytes of the analyzer's output read
MAX_MISSING = 16  # collectives reported
NAME_LIMIT = 120
# The analyzer's words, torch 2.6 to 2.13: one block per collective that not every rank joined.
_HEAD = re.compile(r"^Not all ranks joining collective, sequence number: (\d+)\s*$")
_FIELD = re.compile(r"^(collective|group info|missing ranks|collective state): (.*)$")
_RANKS = re.compile(r"^\{(\s*\d+\s*(,\s*\d+\s*)*)\}$")
# What fr_analyze.py prints where it cannot analyse, before it exits with its own code.
NO_TORCH = "mgpu-fr: no torch"
NO_DUMPS = "mgpu-fr: no dumps"


@dataclasses.dataclass(frozen=True)
class Missing:
    """A collective some ranks of its group never joined."""
    sequence: int
    collective: str
    group: str
    ranks: tuple[int, ...]
    state: str = ""

    def to_dict(self, task_of: Mapping[int, str]) -> dict[str, Any]:
        return {"sequence": self.sequence, "collective": self.collective, "group": self.group,
                "ranks": list(self.ranks), "tasks": [task_of.get(r, f"rank {r}") for r in self.ranks],
                "state": self.state}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the flight recorder showed of a stalled attempt: the collectives not joined, or why
    there is no analysis (`problem`, one line)."""
    dumps: int
    missing: tuple[Missing, ...] = ()
    problem: str | None = None

    def lines(self, task_of: Mapping[int, str]) -> list[str]:
        """The stall report's lines."""
        if self.problem is not None:
            return [f"flight recorder: {self.problem}"]
        if not self.missing:
            return [f"flight recorder: every rank joined every collective recorded ({self.dumps} dumps)"]
        lines = []
        for m in self.missing:
            who = ", ".join(f"{task_of.get(r, 'rank')} (rank {r})" if r in task_of else f"rank {r}" for r in m.ranks)
            lines.append(f"flight recorder: {who} did not join {m.collective} #{m.sequence} "
                         f"(process group {m.group}){f', {m.state} on the others' if m.state else ''}")
        return lines

    def to_dict(self, task_of: Mapping[int, str]) -> dict[str, Any]:
        """As run.json keeps it."""
        return {"dumps": self.dumps, "missing": [m.to_dict(task_of) for m in self.missing],
                **({"problem": self.problem} if self.problem is not None else {})}


def _text(value: str) -> str:
    return console_safe(value.strip()[:NAME_LIMIT])


def read(dumps: int, returncode: int | None, output: bytes, world: int) -> Verdict:
    """The analyzer's answer, from its exit code (None: it timed out) and its output; `world` is the
    job's size: a rank outside it is not one of the job's and is dropped."""
    text = output[:OUTPUT_LIMIT].decode("utf-8", "replace")
    if NO_TORCH in text:
        return Verdict(dumps, problem="no torch in the tasks' Python here: the dumps are kept, not analysed")
    if NO_DUMPS in text or dumps == 0:
        return Verdict(0, problem="no rank answered a dump request (the program does not run torch's worker "
                                  "server: see the failures page)")
    if returncode is None:
        return Verdict(dumps, problem="the analyzer did not finish within its time; the dumps are kept")
    missing: list[Missing] = []
    block: dict[str, str] | None = None
    sequence = 0

    def close() -> None:
        if block is None or len(missing) >= MAX_MISSING:
            return
        ranks_text = block.get("missing ranks", "")
        match = _RANKS.match(ranks_text.strip())
        if match is None:
            return
        ranks = tuple(sorted({int(r) for r in match.group(1).split(",") if int(r) < world}))
        if ranks:
            missing.append(Missing(sequence, _text(block.get("collective", "?")), _text(block.get("group info", "?")),
                                   ranks, _text(block.get("collective state", ""))))

    for line in text.splitlines():
        head = _HEAD.match(line.strip())
        if head is not None:
            close()
            block, sequence = {}, min(int(head.group(1)[:18]), 2**63)
            continue
        field = _FIELD.match(line.strip())
        if field is not None and block is not None and field.group(1) not in block:
            block[field.group(1)] = field.group(2)[:1000]
    close()
    if not missing and dumps < world:
        return Verdict(dumps, problem=f"only {dumps} of {world} ranks answered a dump request: no verdict")
    if returncode != 0 and not missing:
        last = next((line for line in reversed(text.splitlines()) if line.strip()), "no output")
        return Verdict(dumps, problem=f"the analyzer failed (exit {returncode}): {_text(last)}")
    return Verdict(dumps, tuple(missing))
