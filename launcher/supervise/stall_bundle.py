"""A stalled attempt's folder in the run dir, stall-<attempt>/: every task's stacks, the flight
recorder's dumps (flight_recorder.py), each host's `nvidia-smi -q` (gpu_state.py), and a README of
what is there and how to read it. The stacks are also stacks-<attempt>.txt in the run dir (a second
name of the same file, where the file system allows it)."""

from __future__ import annotations

import os

from launcher.supervise.rundir import RunDir

STACKS = "stacks.txt"
README = "README"

README_TEXT = """\
What mgpu collected when attempt {counted} of run {run_id} stalled (no training task made progress
for the stall timeout), before it stopped the tasks: the console's "attempt {counted} failed: stalled".
The folder is named after run.json's number of that attempt, which counts from 0 (attempts[{attempt}]).

stacks.txt  Every task's stacks, one section per task ("===== worker:1 on host ... =====").
            Sections "(read by py-spy ...)" come from the live processes: every thread of
            every process of the task, innermost frame first, C and C++ frames marked [native].
            Other sections are Python's faulthandler dump, written when the task was sent
            SIGABRT because py-spy could not read it (the line before it says why).

flight-recorder/  Where the tasks use torch.distributed and run torch's worker server: each
            rank's flight recorder (rank_<rank>.json: its last collectives, asked for while it
            ran), torch's analyzer's output on them (analyzer.txt), whose verdict (which
            ranks did not join which collective) is in the stall report and run.json. Read
            them again with: python -m torch.distributed.flight_recorder.fr_trace.

nvidia-smi/  Where a host has nvidia-smi on the tasks' PATH: `nvidia-smi -q` run there while the
            tasks stalled (memory, utilisation, clocks, ECC errors, throttling, the processes
            on each GPU), one file per host (<host>.txt). A first line "# nvidia-smi -q ..."
            says it failed or did not end in time.

How to read it: in a synchronous job, the tasks that wait in a collective (frames of
tensorflow, torch, jax, gloo or nccl) wait for the one that is elsewhere: a task in its own
code, reading data or writing a checkpoint, is the likely cause. The stall report names it.
Each task's whole output is its log in the run's folder (<type>-<index>.log).
"""


def folder_name(attempt: int) -> str:
    return f"stall-{attempt}"


def write(run_dir: RunDir, attempt: int, stacks_text: str, stacks_name: str) -> None:
    """The folder, its README and stacks.txt; `stacks_name` in the run dir names the stacks too.
    `attempt` is run.json's number, from 0; the README also says it as the console counts, from 1."""
    folder = folder_name(attempt)
    try:
        os.mkdir(folder, 0o700, dir_fd=run_dir.fd)
    except FileExistsError:  # made already for the flight recorder's dumps
        pass
    for name, text in ((README, README_TEXT.format(attempt=attempt, counted=attempt + 1, run_id=run_dir.path.name)),
                       (STACKS, stacks_text)):
        with open(run_dir.create(f"{folder}/{name}"), "w", encoding="utf-8", errors="replace") as f:
            f.write(text)
    try:
        os.link(f"{folder}/{STACKS}", stacks_name, src_dir_fd=run_dir.fd, dst_dir_fd=run_dir.fd,
                follow_symlinks=False)
    except OSError:  # a file system without hard links: a copy
        with open(run_dir.create(stacks_name), "w", encoding="utf-8", errors="replace") as f:
            f.write(stacks_text)
