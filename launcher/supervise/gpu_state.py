"""On a stall, `nvidia-smi -q` from each host of the attempt where it exists, while the tasks still
run: the state of the GPUs the stalled job holds (host/nvidia_smi.py), kept per host in the stall's
folder as nvidia-smi/<host>.txt. A host without nvidia-smi on the tasks' PATH has no file; one whose
nvidia-smi failed or did not end in time has its status on the file's first line."""

from __future__ import annotations

import concurrent.futures
import os
import re

from launcher.host import nvidia_smi
from launcher.supervise import stall_bundle
from launcher.supervise.attempt import Attempt, AttemptTask, EvidenceAction

FOLDER = "nvidia-smi"
# The whole query on one host, its login over SSH or its srun step included.
HOST_TIMEOUT = nvidia_smi.QUERY_TIMEOUT + 20.0
MAX_HOSTS_AT_ONCE = 32


def file_name(host: str, taken: set[str]) -> str:
    """A file name for `host` that is safe in a folder and unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", host)[:100].lstrip(".") or "host"
    name, n = f"{base}.txt", 1
    while name in taken:
        n += 1
        name = f"{base}-{n}.txt"
    taken.add(name)
    return name


def query(task: AttemptTask) -> nvidia_smi.Query | str:
    """nvidia-smi's answer on the task's host; or, as text, why there is none."""
    nonce = nvidia_smi.new_nonce()
    ran = task.proc.run_beside(nvidia_smi.script(nonce), task.plan, HOST_TIMEOUT, nvidia_smi.answer_limit())
    if ran.problem is not None:
        return ran.problem
    answer = nvidia_smi.parse_answer(ran.out, nonce)
    return answer if answer is not None else f"an unreadable answer (exit status {ran.status})"


def text_of(answer: nvidia_smi.Query) -> str:
    if answer.status == 0:
        return answer.text
    why = (f"did not end within {nvidia_smi.QUERY_TIMEOUT} s" if answer.status == nvidia_smi.TIMED_OUT
           else f"exited with status {answer.status}")
    return f"# nvidia-smi -q {why}\n{answer.text}"


class GpuState(EvidenceAction):
    """`nvidia-smi -q` on each host of the running tasks, once per host, all hosts at once."""
    what = "read the GPUs' state with nvidia-smi"

    def collect(self, attempt: Attempt) -> None:
        one_per_host: dict[str, AttemptTask] = {}
        for task in attempt.running():
            one_per_host.setdefault(task.plan.host, task)
        if not one_per_host:
            return
        workers = min(len(one_per_host), MAX_HOSTS_AT_ONCE)
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="smi") as pool:
            answers = list(pool.map(query, one_per_host.values()))
        found = [(host, a) for host, a in zip(one_per_host, answers) if isinstance(a, nvidia_smi.Query) and a.found]
        for host, answer in zip(one_per_host, answers):
            if isinstance(answer, str):
                attempt.output.notice(f"nvidia-smi on {host}: {answer}")
        if not found:
            return
        folder = f"{stall_bundle.folder_name(attempt.number)}/{FOLDER}"
        for name in (stall_bundle.folder_name(attempt.number), folder):
            try:
                os.mkdir(name, 0o700, dir_fd=attempt.run_dir.fd)
            except FileExistsError:
                pass
        taken: set[str] = set()
        for host, answer in found:
            with open(attempt.run_dir.create(f"{folder}/{file_name(host, taken)}"), "w", encoding="utf-8",
                      errors="replace") as f:
                f.write(text_of(answer))
