"""Tasks as one Slurm job step: a single `srun` for every task of an attempt.

Why `srun --label --verbose`, read line by line, and not per-task output files: srun labels
every line a task prints with the task's rank, so one pipe carries every task's stdout (and one
its stderr) and the launcher splits them back into per-task streams as they arrive; nothing
depends on a file system shared with the nodes, and the supervisor sees each line when it is
printed. srun passes a task's output on in messages of at most SRUN_PIECE bytes, each labelled
and ended with a newline of srun's own when it has none: a labelled line of exactly SRUN_PIECE
bytes (without its newline) is a piece of a longer line, which the task's stream gets joined
again, so each task's stream carries exactly what the task wrote (but for a last line
without a newline, which srun ends with one). srun reports each task's end as it happens ("node1: task 1: Exited with exit code 3",
and with --verbose also "tasks 0-1: Completed"), so each task's exit status is known when that
task ends, not only when the step ends; a task that srun never reported takes srun's own status.

A restart starts a new step. Signals go to the step's tasks through `scancel --signal`, which
reaches every task at once (a step cannot signal one of its tasks alone); srun itself would
turn a SIGTERM into a SIGKILL of every task.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Sequence

from launcher import protocol
from launcher.config.hostlist import expand_entry
from launcher.host import beside_task, py_spy
from launcher.errors import TaskFailed, UsageError
from launcher.plan.planner import TaskPlan
from launcher.plan.render import slurm_step_document
from launcher.backends.base import Attempt, Backend, TaskProcess
from launcher.backends.pipes import close_pipe_readers, pipe_reader
from launcher.backends.slurm_node import node_gone
from launcher.bootstrap.slurm_task import plan_environment

BOOTSTRAP_MODULE = "launcher.bootstrap.slurm_task"
# Linux gives a program's arguments and environment together 2 MiB or more; the plans take at most half.
MAX_PLAN_BYTES = 1_000_000
SCANCEL_TIMEOUT = 15.0
_PR_SET_PDEATHSIG = 1

_LABELLED = re.compile(rb"^\s*(\d+): ?(.*)$", re.DOTALL)
SRUN_PIECE = 1024  # slurmstepd's largest message of task output (MAX_MSG_LEN in Slurm's io_hdr.h)
_TASK_END = re.compile(r"^srun: (?:error: |launch/slurm: _task_finish: )?(\S+): tasks? ([\d,-]+): (.+)$")
_STEP_ID = re.compile(r"launching StepId=(\d+\.\d+)")
# What srun prints without --verbose is kept; the rest of --verbose's chatter is not a task's output.
_WORTH_SHOWING = re.compile(r"^(srun|slurmstepd\S*): (error|fatal|warning|Job step|Force|.*cancel)", re.IGNORECASE)
_SIGNAL_BY_TEXT = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}


def task_status(text: str) -> int | None:
    """An exit status, -N for a signal, from srun's wording of a task's end ("Completed", "Killed", ...)."""
    if text == "Completed":
        return 0
    exited = re.match(r"Exited with exit code (\d+)", text)
    if exited:
        return int(exited.group(1))
    return -_SIGNAL_BY_TEXT[text] if text in _SIGNAL_BY_TEXT else None


def srun_argv(plans: Sequence[TaskPlan], python: str, allocation_nodes: Sequence[str] = ()) -> list[str]:
    """The step's srun. The nodes of the allocation (`allocation_nodes`) that no task uses (spares,
    and nodes left out) are excluded: srun would otherwise pick the step's nodes among them."""
    nodes = list(dict.fromkeys(plan.host for plan in plans))
    exclude = [node for node in allocation_nodes if node not in nodes]
    # A sidecar evaluator may fail without stopping training, so Slurm's own fail-fast only
    # guards steps without one; the supervisor stops the step on any training task's failure.
    has_sidecar = any(plan.type not in protocol.TRAINING_TASK_TYPES for plan in plans)
    return [
        "srun", "--label", "--verbose", "--export=ALL", "--input=none", "--distribution=block",
        f"--kill-on-bad-exit={0 if has_sidecar else 1}",
        f"--ntasks={len(plans)}", f"--nodes={len(nodes)}",
        *([f"--exclude={','.join(exclude)}"] if exclude else []),
        python, "-m", BOOTSTRAP_MODULE,
    ]


def no_cores_argv(step_id: str, nodes: Sequence[str]) -> list[str]:
    """A step beside the tasks' step (`--overlap`: it shares their CPUs) that lowers the core file
    limit of every process of step `step_id` to 0 on each of its nodes: what precedes the SIGABRT
    that asks the tasks for their stacks, whose default action dumps core."""
    lower = (f"for p in $(scontrol listpids {step_id} {py_spy.SLURM_NODE_WORD} 2>/dev/null "
             f"| awk 'NR > 1 {{ print $1 }}'); do "
             f'prlimit --pid "$p" --core=0: 2>/dev/null; done; exit 0')
    return ["srun", "--overlap", "--quiet", "--input=none", "--gres=none", f"--nodelist={','.join(nodes)}",
            f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "sh", "-c", lower]


def step_environment(plans: Sequence[TaskPlan], environ: dict[str, str]) -> dict[str, str]:
    """srun's environment: the launcher's, less its CUDA_VISIBLE_DEVICES (so that one in a task
    means Slurm bound GPUs to the step), plus the plans. Raises UsageError when they do not fit."""
    handover = plan_environment(slurm_step_document(plans))
    size = sum(len(value) for value in handover.values())
    if size > MAX_PLAN_BYTES:
        raise UsageError(f"the plan of {len(plans)} tasks takes {size} bytes, more than the "
                         f"{MAX_PLAN_BYTES} that mgpu hands to a Slurm step in its environment")
    env = {k: v for k, v in environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update({**handover, protocol.ENV_RUN_ID: plans[0].env[protocol.ENV_RUN_ID]})
    return env


def _allow_open_files(needed: int) -> None:
    """Two pipes per task (four descriptors) plus a log each: raise the soft limit if it is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _die_with_parent() -> None:
    """In srun's child: SIGTERM when the launcher dies, even by SIGKILL; srun then ends the step."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class SlurmStep:
    """One running `srun`: splits its output per task and records each task's end."""

    def __init__(self, argv: list[str], env: dict[str, str], count: int, attempt: int, nodes: Sequence[str] = ()):
        self.count = count
        self.nodes = list(nodes)  # where the step's tasks run
        self.step_id: str | None = None
        self.statuses: dict[int, int] = {}
        self._lock = threading.Lock()
        self._signalled: dict[int, float] = {}
        self._end_order: list[int] = []  # ranks in the order srun reported their ends
        self._reported: set[int] = set()  # ranks whose status poll() has returned
        self._nodes_lost: dict[str, str | None] = {}  # once the step has ended: why each node is gone
        pipes = [os.pipe() for _ in range(2 * self.count)]
        self.readers = [pipe_reader(read) for read, _ in pipes]  # rank r: stdout 2r, stderr 2r+1
        self._writers = [write for _, write in pipes]
        try:
            self.popen = subprocess.Popen(
                argv, env={**env, **protocol.attempt_env(attempt)},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=_die_with_parent)
        except BaseException as exc:
            self._close_writers(range(len(self._writers)))
            for reader in self.readers:
                reader.close()
            if isinstance(exc, OSError):
                raise TaskFailed(f"cannot start srun: {exc.strerror or exc}") from exc
            raise
        self._stderr_done = threading.Event()
        self._threads = [
            threading.Thread(target=self._split, args=(self.popen.stdout, 0), daemon=True),
            threading.Thread(target=self._split, args=(self.popen.stderr, 1), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- output ------------------------------------------------------------------

    def _split(self, source: BinaryIO, stream: int) -> None:
        """Route each line to its task's stream (0 stdout, 1 stderr); read srun's own lines."""
        try:
            for line in iter(source.readline, b""):
                labelled = _LABELLED.match(line)
                if labelled and int(labelled.group(1)) < self.count:
                    text = labelled.group(2)
                    if len(text) == SRUN_PIECE + 1 and text.endswith(b"\n"):
                        text = text[:-1]  # a piece of a longer line: the newline is srun's, not the task's
                    self._write(int(labelled.group(1)), stream, text)
                else:
                    self._srun_line(line)
        finally:
            self._close_writers(range(stream, len(self._writers), 2))
            if stream == 1:
                self._stderr_done.set()

    def _srun_line(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip("\n")
        step = _STEP_ID.search(text)
        if step:
            self.step_id = step.group(1)
        ended = _TASK_END.match(text)
        ranks = list(range(self.count))
        if ended:
            try:
                ranks = [int(rank) for rank in expand_entry(f"[{ended.group(2)}]")]
            except ValueError:
                pass
            status = task_status(ended.group(3))
            for rank in ranks:
                if status is not None and rank < self.count:
                    self._record(rank, status)
            if status == 0:
                return
        if _WORTH_SHOWING.match(text):
            for rank in ranks:
                self._write(rank, 1, line if line.endswith(b"\n") else line + b"\n")

    def _write(self, rank: int, stream: int, data: bytes) -> None:
        fd = self._writers[2 * rank + stream]
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            pass  # the task's stream was closed: the line has nowhere to go

    def _close_writers(self, indices) -> None:
        for index in indices:
            with self._lock:
                fd, self._writers[index] = self._writers[index], -1
            if fd >= 0:
                os.close(fd)

    # -- status and signals ----------------------------------------------------------

    def node_lost(self, node: str) -> str | None:
        if node not in self._nodes_lost:
            self._nodes_lost[node] = node_gone(node)
        return self._nodes_lost[node]

    def poll(self, rank: int) -> int | None:
        """The task's status once srun reported it, and once every task that ended before it has
        been reported too: srun may tell of several ends at once, and the first failure must be
        seen first (a task stopped by Slurm's fail-fast is not the one that failed)."""
        if rank not in self.statuses and self.popen.poll() is not None and self._stderr_done.is_set():
            self._record(rank, self.popen.returncode)  # srun ended without a word on this task
        with self._lock:
            if rank not in self.statuses:
                return None
            earlier = self._end_order[:self._end_order.index(rank)]
            if not all(other in self._reported for other in earlier):
                return None
            self._reported.add(rank)
            return self.statuses[rank]

    def _record(self, rank: int, status: int) -> None:
        with self._lock:
            if rank not in self.statuses:
                self.statuses[rank] = status
                self._end_order.append(rank)

    def signal(self, signum: int) -> None:
        """Send `signum` to every task of the step (once, however many tasks ask for it)."""
        if self.popen.poll() is not None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._signalled.get(signum, -60.0) < 1.0:
                return
            self._signalled[signum] = now
        if self.step_id is None:  # no task started yet: srun itself gives the step up (none is stopped)
            if signum != signal.SIGCONT:
                self.popen.send_signal(signal.SIGTERM)
            return
        if signum == signal.SIGABRT and self.nodes:
            self._run_beside(no_cores_argv(self.step_id, self.nodes))
        self._run_beside(["scancel", f"--signal={signal.Signals(signum).name[3:]}", self.step_id])
        if signum == signal.SIGKILL:
            self.popen.kill()

    def _run_beside(self, argv: list[str]) -> None:
        """A Slurm command about the step, quiet, within SCANCEL_TIMEOUT; its failure is said, not raised."""
        try:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=SCANCEL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"mgpu: {argv[0]} for step {self.step_id} failed: {exc}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Wait for srun and its readers; after 5 s, kill the step and srun."""
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.kill()
            self.popen.wait(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
        for stream in (self.popen.stdout, self.popen.stderr):
            stream.close()


class SlurmTaskProcess(TaskProcess):
    """One task's view of the step: its own two streams and exit status."""

    def __init__(self, step: SlurmStep, rank: int, node: str | None = None):
        self._step = step
        self._rank = rank
        self._node = node
        self.pid = step.popen.pid  # srun's: the tasks run under slurmstepd on their nodes
        self.stdout = step.readers[2 * rank]
        self.stderr = step.readers[2 * rank + 1]

    def poll(self) -> int | None:
        return self._step.poll(self._rank)

    def signal_tree(self, signum: int) -> None:
        self._step.signal(signum)

    def lost(self) -> str | None:
        """Once the step has ended: whether Slurm's controller says the task's node is gone (its
        slurmd not answering, the node down), asked once per node of the step."""
        if self._node is None or self._step.popen.poll() is None:
            return None
        return self._step.node_lost(self._node)

    def spy_stacks(self, native: bool, task: TaskPlan, timeout: float) -> py_spy.Answer | None:
        """py-spy on the task's node, in a step beside the tasks' (`--overlap`), for the processes
        `scontrol listpids` gives the task's rank."""
        step_id = self._step.step_id
        if step_id is None or self.poll() is not None:
            return py_spy.Answer(None, problem="the task is not running")
        nonce = py_spy.new_nonce()
        command = py_spy.script(py_spy.listing_of_slurm_task(step_id, self._rank), native,
                                [task.argv[0]] if task.argv else [], nonce, py_spy.configured())
        argv = ["srun", "--overlap", "--quiet", "--input=none", "--gres=none", f"--nodelist={task.host}",
                "--nodes=1", "--ntasks=1", *([f"--chdir={task.workdir}"] if task.workdir else []), "sh", "-c", command]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return py_spy.Answer(None, problem=f"srun for py-spy did not end within {timeout:g} s")
        except OSError as exc:
            return py_spy.Answer(None, problem=f"cannot run srun: {exc.strerror or exc}")
        return py_spy.parse_answer(done.stdout, nonce)

    def run_beside(self, command: str, task: TaskPlan, timeout: float, limit: int) -> beside_task.Ran:
        """In a step beside the tasks' (`--overlap`) on the task's node."""
        if self._step.step_id is None or self.poll() is not None:
            return beside_task.Ran(None, problem="the task is not running")
        argv = ["srun", "--overlap", "--quiet", "--input=none", "--gres=none", f"--nodelist={task.host}",
                "--nodes=1", "--ntasks=1", *([f"--chdir={task.workdir}"] if task.workdir else []),
                "sh", "-c", beside_task.with_task_path(command, task.env)]
        ran = beside_task.run_here(shlex.join(argv), timeout, limit, None, {})
        return ran if ran.problem is None else beside_task.Ran(None, problem=f"srun: {ran.problem}")

    def close(self) -> None:
        close_pipe_readers(self.stdout, self.stderr)


class SlurmAttempt(Attempt):
    """One attempt's step: srun runs when the attempt begins, each task's start() hands out its
    view of the step, end() waits for srun to end."""

    def __init__(self, step: SlurmStep):
        self._step = step

    def start(self, task: TaskPlan) -> SlurmTaskProcess:
        return SlurmTaskProcess(self._step, task.slurm_rank, task.host)

    def end(self) -> None:
        self._step.close()


class SlurmBackend(Backend):
    """Starts every task of an attempt as one step (SlurmAttempt); owns the step."""

    def __init__(self, plans: Sequence[TaskPlan], python: str = sys.executable, allocation_nodes: Sequence[str] = ()):
        """Checks that the plans can be handed to a step; nothing starts until begin_attempt().
        `allocation_nodes`: every node of the allocation, those that no task uses left out of the step."""
        self._count = len(plans)
        self._python = python
        self._allocation_nodes = tuple(allocation_nodes)
        self._step_of(plans)  # refuses plans that a step cannot take, before anything starts
        _allow_open_files(6 * self._count + 256)

    def _step_of(self, plans: Sequence[TaskPlan]) -> tuple[list[str], dict[str, str], list[str]]:
        """srun's argv and environment for these plans, and the nodes they run on."""
        nodes = list(dict.fromkeys(plan.host for plan in plans))
        return srun_argv(plans, self._python, self._allocation_nodes), step_environment(plans, dict(os.environ)), nodes

    def begin_attempt(self, tasks: Sequence[TaskPlan], attempt: int) -> SlurmAttempt:
        if not tasks:
            raise TaskFailed("a step needs at least one task")
        if len(tasks) > self._count:  # hosts taken back (--min-hosts): more pipes to read
            self._count = len(tasks)
            _allow_open_files(6 * self._count + 256)
        for task in tasks:
            if task.slurm_rank is None:
                raise TaskFailed(f"{task.name} is not planned as a task of a Slurm step")
        # A node left out between attempts changes the plans (a spare's, or fewer nodes with
        # --min-hosts): the step is made from the attempt's.
        argv, env, nodes = self._step_of(tasks)
        return SlurmAttempt(SlurmStep(argv, env, len(tasks), attempt, nodes))
