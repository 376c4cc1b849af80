"""What each task of a job is given to keep PyTorch's flight recorder and to answer for it
(flight_recorder.py says why): the recorder's buffer for every member of the job, and for a task
on this machine where torch writes its own dumps and the socket of torch's worker server, in the
run's folder. What the user set is left alone."""

from __future__ import annotations

import os
import pathlib
from typing import Callable, Iterable, Mapping

from launcher.plan.planner import TaskPlan
from launcher.protocol import ENV_TORCH_RANK

ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"
ENV_BUFFER_BEFORE = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # torch's name before 2.7, which it still reads
ENV_DUMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
ENV_DUMP_FILE_BEFORE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
ENV_SOCKET = "TORCH_WORKER_SERVER_SOCKET"
# Collectives kept per rank: torch's own suggestion; entries are recorded as they are issued.
BUFFER_ENTRIES = "2000"
FOLDER = "flight-recorder"
SOCKET_PATH_LIMIT = 107  # sun_path holds 108 bytes, its last the NUL


def rank_of(plan: TaskPlan) -> int | None:
    """The task's rank in torch's job; None: not a member (the evaluator)."""
    rank = plan.env.get(ENV_TORCH_RANK)
    return int(rank) if rank is not None and rank.isdigit() else None


def socket_path(run_dir: pathlib.Path, attempt: int, rank: int) -> pathlib.Path:
    return (run_dir / f"fr-{attempt}-{rank}.sock").absolute()


def remote_socket_name(run_id: str, attempt: int, rank: int) -> str | None:
    """The worker server's socket of a task on another host: in the task's own folder there (a
    relative path: the socket is where the task runs), named after the run; None where the name
    is too long for a socket."""
    name = f".mgpu-fr-{run_id}-{attempt}-{rank}.sock"
    return name if len(os.fsencode(name)) <= SOCKET_PATH_LIMIT else None


def start_env(plan: TaskPlan, run_dir: pathlib.Path | None, attempt: int,
              inherited: Mapping[str, str], run_id: str = "") -> dict[str, str]:
    """What a task of the job is given to keep its recorder (`run_dir` None: the task is on another
    host, where the run's folder is not: its worker server's socket is in its folder there); what
    the user set, in the plan or in `inherited` (the environment the task inherits), is left alone."""
    rank = rank_of(plan)
    if rank is None:
        return {}
    given = lambda *names: any(n in plan.env or n in inherited for n in names)  # noqa: E731
    env = {} if given(ENV_BUFFER, ENV_BUFFER_BEFORE) else {ENV_BUFFER: BUFFER_ENTRIES}
    if run_dir is None:
        remote = remote_socket_name(run_id, attempt, rank) if run_id else None
        if remote is not None and not given(ENV_SOCKET):
            env[ENV_SOCKET] = remote
        return env
    if not given(ENV_DUMP_FILE, ENV_DUMP_FILE_BEFORE):
        env[ENV_DUMP_FILE] = str((run_dir / f"{FOLDER}-{attempt}-rank-").absolute())
    sock = socket_path(run_dir, attempt, rank)
    if not given(ENV_SOCKET) and len(os.fsencode(str(sock))) <= SOCKET_PATH_LIMIT:
        env[ENV_SOCKET] = str(sock)
    return env


def remove_sockets(unlink: Callable[[str], None], attempt: int, plans: Iterable[TaskPlan]) -> None:
    """The attempt's sockets in the run's folder: a task killed leaves its own behind."""
    for plan in plans:
        rank = rank_of(plan)
        if rank is not None:
            unlink(socket_path(pathlib.Path("."), attempt, rank).name)
