"""Whether a node of the allocation is still up, as Slurm's controller says: what stands for a fresh
login under Slurm, where mgpu has no login of its own to a node.

A node whose slurmd stopped answering is marked NOT_RESPONDING by the controller, then DOWN (after
the cluster's SlurmdTimeout), and the step is ended: srun then says a task of a node left standing
was killed, and has no word of the tasks of the node gone. So once a step has ended, its nodes'
states name the node at fault (SlurmTaskProcess.lost), and the node's state answers for a fresh
login (SlurmFleet.login_ok). `scontrol show node --oneliner NODE`'s answer is read as untrusted
text: bounded in size and time, only its `State=` word read.
"""

from __future__ import annotations

import re
import subprocess

MAX_ANSWER_BYTES = 64 * 1024
SCONTROL_TIMEOUT_S = 10.0
_STATE = re.compile(r"(?:^|\s)State=([A-Z_+]{1,200})(?:\s|$)")
# A node in one of these states runs no task of the step: its tasks are lost with it.
GONE = frozenset({"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_ISSUED"})


def node_state(answer: str) -> tuple[str, ...] | None:
    """The words of the node's state in scontrol's line ("DOWN", "NOT_RESPONDING"); None when the
    line names none."""
    found = _STATE.search(answer[:MAX_ANSWER_BYTES])
    return tuple(found.group(1).split("+")) if found else None


def node_up(answer: str) -> bool | None:
    """From scontrol's line for a node: False when its state says it is gone (DOWN, FAIL, not
    responding, ...), True for any other state, None when the line names no state."""
    state = node_state(answer)
    return None if state is None else not GONE & set(state)


def _ask(node: str, timeout: float) -> str | None:
    try:
        ran = subprocess.run(["scontrol", "show", "node", "--oneliner", node], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return ran.stdout[:MAX_ANSWER_BYTES].decode("utf-8", errors="replace") if ran.returncode == 0 else None


def ask_node_up(node: str, timeout: float = SCONTROL_TIMEOUT_S) -> bool | None:
    """Whether Slurm's controller says `node` is up; None when it could not be asked."""
    answer = _ask(node, timeout)
    return None if answer is None else node_up(answer)


def node_gone(node: str, timeout: float = SCONTROL_TIMEOUT_S) -> str | None:
    """Why `node` is gone, in a few words, when Slurm's controller says it is; None when it is up
    or could not be asked."""
    answer = _ask(node, timeout)
    state = None if answer is None else node_state(answer)
    if state is None or not GONE & set(state):
        return None
    return f"Slurm says node {node} is {'+'.join(state).lower()}"
