"""PyTorch's flight recorder (a ring of each rank's last collectives) for the tasks of a job: what
each task is given to keep one and to answer for it, and, on a stall, the evidence actions that
have each rank dump it, run torch's analyzer on the dumps and keep its verdict (which ranks did
not join which collective) in the stall's folder, the stall report and run.json.

Every member of the job gets the recorder's buffer (TORCH_FR_BUFFER_SIZE, unless the user set it
or torch's older name); a task on this machine also gets where torch writes the dumps it makes by
itself (TORCH_FR_DUMP_TEMP_FILE: NCCL's watchdog, on a collective's timeout) and the Unix socket of
torch's worker server (TORCH_WORKER_SERVER_SOCKET), in the run's folder. torch lets a dump be asked
for from outside the process only through that server, which the program starts
(`torch.distributed.elastic.control_plane.worker_main()`); it answers from a thread of its own,
so ranks blocked in a collective or in Python answer alike, gloo's and NCCL's. A program without
it has no dump on a stall, and the report says so where its stacks show torch. A task on another
host has the server's socket in its folder there, and is asked there with the tasks' Python
(fr_remote.py), through the run's connection to it; its dump is then analysed with the others.

The analyzer runs with the tasks' Python (fr_analyze.py, a program of its own): mgpu never imports
torch. What a task's server answers is bounded in size and time, and the analyzer's output is read
as untrusted text (fr_verdict.py)."""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import sys

from launcher.plan.planner import TaskPlan
from launcher.protocol import ENV_TORCH_WORLD_SIZE
from launcher.supervise import fr_remote, fr_verdict, stall_bundle
from launcher.supervise.flight_env import ENV_SOCKET, FOLDER, rank_of, remote_socket_name, socket_path
from launcher.supervise.attempt import Attempt, AttemptTask, EvidenceAction

DUMP_LIMIT = 64 << 20  # bytes of one rank's dump read
DUMP_TIMEOUT = 20.0  # seconds for one rank's dump
ANALYZE_TIMEOUT = 120.0  # seconds for torch's analyzer (its import of torch included)
ANALYZER = pathlib.Path(__file__).with_name("fr_analyze.py")


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def ask_dump(path: str, timeout: float = DUMP_TIMEOUT) -> bytes | str:
    """One rank's recorder, as its worker server answers `fr_trace_json`; or, as text, why not."""
    conn = _UnixHTTP(path, timeout)
    try:
        conn.request("POST", "/handler/fr_trace_json")
        response = conn.getresponse()
        body = response.read(DUMP_LIMIT + 1)
        if response.status != 200:
            return f"its worker server answered HTTP {response.status}"
        if len(body) > DUMP_LIMIT:
            return f"its dump is over {DUMP_LIMIT >> 20} MiB"
        return body
    except (OSError, http.client.HTTPException) as exc:
        return f"no dump ({type(exc).__name__}: {exc})"
    finally:
        conn.close()


def _stall_folder(attempt: Attempt) -> str:
    folder = stall_bundle.folder_name(attempt.number)
    for name in (folder, f"{folder}/{FOLDER}"):
        try:
            os.mkdir(name, 0o700, dir_fd=attempt.run_dir.fd)
        except FileExistsError:
            pass
    return f"{folder}/{FOLDER}"


class DumpFlightRecorder(EvidenceAction):
    """Each running rank's recorder, asked of its worker server while the tasks live, kept as
    stall-<attempt>/flight-recorder/rank_<rank>.json."""
    what = "ask each rank for its flight recorder"

    def collect(self, attempt: Attempt) -> None:
        ranks = {t.plan.name: rank_of(t.plan) for t in attempt.tasks}
        asked: list[tuple[AttemptTask, int, str]] = []
        remote: list[tuple[AttemptTask, int, str]] = []  # on another host: asked there (fr_remote.py)
        for task in attempt.running():
            rank = ranks[task.plan.name]
            if rank is None:
                continue
            if not attempt.backend.writes_here(task.plan):
                name = remote_socket_name(attempt.run_id, attempt.number, rank)
                if name is not None and ENV_SOCKET not in task.plan.env:  # the user's own socket: not asked
                    remote.append((task, rank, name))
                continue
            path = socket_path(attempt.run_dir.path, attempt.number, rank)
            if path.is_socket():
                asked.append((task, rank, str(path)))
        world = next((int(t.plan.env[ENV_TORCH_WORLD_SIZE]) for t in attempt.tasks
                      if t.plan.env.get(ENV_TORCH_WORLD_SIZE, "").isdigit()), 0)
        attempt.flight = {"task_of": {r: n for n, r in ranks.items() if r is not None}, "world": world, "dumps": 0}
        if not asked and not remote:
            return
        folder = _stall_folder(attempt)
        nonce = secrets.token_hex(8)
        with concurrent.futures.ThreadPoolExecutor(min(len(asked) + len(remote), 32), thread_name_prefix="fr") as pool:
            answers = list(pool.map(lambda one: ask_dump(one[2]), asked))
            answers += list(pool.map(lambda one: fr_remote.ask_remote_dump(one[0], one[2], DUMP_LIMIT, DUMP_TIMEOUT,
                                                                           nonce), remote))
        for (task, rank, _), answer in zip(asked + remote, answers):
            if isinstance(answer, str):
                attempt.output.notice(f"{task.plan.name}: flight recorder: {answer}")
                continue
            with open(attempt.run_dir.create(f"{folder}/rank_{rank}.json"), "wb") as f:
                f.write(answer)
            attempt.flight["dumps"] += 1


def analyzer_python(plans: list[TaskPlan]) -> str:
    """The tasks' Python: a script's interpreter, as the plan runs it, where it is on this machine
    too (a remote task's may not be); else mgpu's own."""
    for plan in plans:
        if plan.argv and os.path.basename(plan.argv[0]).startswith("python") and shutil.which(plan.argv[0]):
            return plan.argv[0]
    return sys.executable


class AnalyzeFlightRecorder(EvidenceAction):
    """torch's analyzer on the dumps, once the tasks are stopped: its output kept beside them
    (analyzer.txt), its verdict in run.json and the stall report."""
    what = "analyse the flight recorder's dumps"

    def collect(self, attempt: Attempt) -> None:
        flight = attempt.flight
        if not flight or not flight["task_of"]:
            return
        if flight["dumps"] == 0:
            waits_in_torch = any(s.collected and (w := s.whereabouts()) is not None and w.framework == "torch"
                                 for s in attempt.spied.values())
            if not waits_in_torch:  # not a torch program, most likely: nothing to say
                return
            verdict = fr_verdict.read(0, 0, b"", flight["world"])
        else:
            folder = _stall_folder(attempt)
            try:
                done = subprocess.run([analyzer_python(attempt.plans), str(ANALYZER), str(attempt.run_dir / folder)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      timeout=ANALYZE_TIMEOUT, check=False)
                code, output = done.returncode, done.stdout
            except subprocess.TimeoutExpired as exc:
                code, output = None, exc.stdout or b""
            except OSError as exc:
                code, output = 127, f"cannot run the analyzer: {exc.strerror or exc}".encode()
            with open(attempt.run_dir.create(f"{folder}/analyzer.txt"), "wb") as f:
                f.write(output[:fr_verdict.OUTPUT_LIMIT])
            verdict = fr_verdict.read(flight["dumps"], code, output, flight["world"])
        flight["verdict"] = verdict
        attempt.record.attempt_flight_recorder(verdict.to_dict(flight["task_of"]))


def report_lines(attempt: Attempt) -> list[str]:
    """The stall report's lines of the recorder's verdict; none where there is none."""
    flight = attempt.flight
    if not flight or "verdict" not in flight:
        return []
    return flight["verdict"].lines(flight["task_of"])
