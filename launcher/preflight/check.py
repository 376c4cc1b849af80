"""Pre-launch host checks (`mgpu check`, and `mgpu launch` before starting remote tasks).

For every host, in parallel: can we log in; does the task's program exist;
which Python, and does it import TensorFlow (and the built-in trainer when the
tasks run it) with the same TensorFlow version as this machine (or, without
TensorFlow here, as the first host); are the tasks' ports free; how many GPUs
does nvidia-smi list; with --legacy-keras (TF_USE_LEGACY_KERAS=1 in the plan), does tf_keras
import, of the host's TensorFlow series. One table row per host; any failure raises. TensorFlow
is required by the built-in trainer and by --legacy-keras: another program may not use it (a
Keras 3 program on the JAX backend, say), so there it is shown, not demanded.

This module never imports paramiko or TensorFlow: remote hosts are probed
through a runner, local ones with a subprocess.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import pathlib
import shlex
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable, Sequence, TextIO, TypeVar

from launcher.errors import CheckFailed, ConnectError, MgpuError, UsageError
from launcher.plan.planner import LEGACY_KERAS_ENV, TRAINER_MODULE, TaskPlan
from launcher.host import probe as host_probe
from launcher.runners.ssh import remote_command

# Seconds a host gets to run the probe once connected (importing TensorFlow takes a few).
PROBE_TIMEOUT = 90.0
# Hosts probed at once.
_PARALLEL_PROBES = 32
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-macos", "intel-tensorflow")


@dataclasses.dataclass
class HostReport:
    host: str
    tasks: tuple[str, ...]
    ssh: str = "-"  # "ok", "local", or "failed"
    python: str = "-"
    tensorflow: str = "-"
    tf_keras: str = "-"  # checked only when tasks run with --legacy-keras
    ports: str = "-"
    gpus: str = "-"
    problems: list[str] = dataclasses.field(default_factory=list)
    error: MgpuError | None = None  # a connection error, kept to re-raise with its type

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str:
        return "; ".join(self.problems) if self.problems else "ok"


def local_tensorflow_version() -> str | None:
    """The TensorFlow version installed here, read from package metadata (TensorFlow is not imported)."""
    for name in _TF_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def probe_command(
    program: str,
    python: str,
    python_required: bool,
    ports: Iterable[int],
    workdir: str | None,
    modules: Sequence[str],
    legacy_keras: bool = False,
) -> str:
    """A command that probes a host and prints one JSON object on stdout.

    Keys: workdir_missing, program_missing, python_missing (true when so), else those
    of launcher/host/probe.py, whose source runs with the task's Python.
    """
    port_list = ",".join(str(int(p)) for p in ports)
    lines = []
    if workdir:
        lines.append(f"cd {shlex.quote(remote_command.safe_workdir(workdir))} 2>/dev/null || {{ echo '{{\"workdir_missing\": true}}'; exit 0; }}")
    lines.append(
        f"command -v {shlex.quote(program)} >/dev/null 2>&1 || {{ echo '{{\"program_missing\": true}}'; exit 0; }}"
    )
    missing = '{"python_missing": true}' if python_required else "{}"
    lines.append(f"command -v {shlex.quote(python)} >/dev/null 2>&1 || {{ echo '{missing}'; exit 0; }}")
    lines.append(
        "TF_CPP_MIN_LOG_LEVEL=3 exec "
        + " ".join(shlex.quote(a) for a in (python, "-c", probe_source(), port_list, ",".join(modules),
                                             *(["legacy-keras"] if legacy_keras else [])))
        + " </dev/null"
    )
    return remote_command.sh("\n".join(lines))




@functools.lru_cache(maxsize=1)
def probe_source() -> str:
    return pathlib.Path(host_probe.__file__).read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class _Probe:
    program: str
    python: str
    python_required: bool
    modules: tuple[str, ...]
    legacy_keras: bool = False
    tensorflow_required: bool = False


def probe_python(plan: TaskPlan) -> str:
    """The interpreter that runs the probe on the plan's host."""
    return _probe_for(plan).python


def _probe_for(plan: TaskPlan) -> _Probe:
    argv = plan.argv
    legacy_keras = plan.env.get(LEGACY_KERAS_ENV) == "1"
    if len(argv) >= 3 and argv[1:3] == ("-m", TRAINER_MODULE):
        return _Probe(argv[0], argv[0], True, (TRAINER_MODULE,), legacy_keras, tensorflow_required=True)
    if os.path.basename(argv[0]).startswith("python"):
        return _Probe(argv[0], argv[0], True, (), legacy_keras, tensorflow_required=legacy_keras)
    # Some other program: Python is only used for the probe itself, and may be absent.
    return _Probe(argv[0], "python3", legacy_keras, (), legacy_keras, tensorflow_required=legacy_keras)


def legacy_keras_fix(tensorflow_version: str | None) -> str:
    """The pip command that installs the tf-keras of a TensorFlow version's series."""
    series = ".".join((tensorflow_version or "").split(".")[:2])
    return f"pip install 'tf-keras~={series}.0'" if series.count(".") == 1 else "pip install tf-keras"


def _check_tf_keras(report: HostReport, result: dict) -> None:
    """tf_keras must import and be of the host's TensorFlow series (each tf-keras requires its own)."""
    tensorflow = result.get("tensorflow")
    if "tf_keras" in result:
        report.tf_keras = result["tf_keras"]
        if tensorflow and result["tf_keras"].split(".")[:2] != tensorflow.split(".")[:2]:
            report.problems.append(f"tf_keras {result['tf_keras']} does not match tensorflow {tensorflow} "
                                   f"(--legacy-keras): {legacy_keras_fix(tensorflow)}")
    else:
        report.tf_keras = "missing"
        report.problems.append(f"tf_keras does not import (--legacy-keras needs it): {legacy_keras_fix(tensorflow)}")


Runner = Callable[[TaskPlan, str, float], "tuple[int, bytes, bytes]"]


def _run_local(plan: TaskPlan, command: str, timeout: float) -> tuple[int, bytes, bytes]:
    try:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise CheckFailed(f"{plan.host}: the check did not finish within {timeout:g} s") from e
    return done.returncode, done.stdout, done.stderr


def _check_host(host_plans: Sequence[TaskPlan], run: Runner) -> HostReport:
    first = host_plans[0]
    report = HostReport(first.host, tuple(p.name for p in host_plans))
    probe = _probe_for(first)
    ports = [p.port for p in host_plans if p.port is not None]
    command = probe_command(probe.program, probe.python, probe.python_required, ports, first.workdir, probe.modules,
                            probe.legacy_keras)
    try:
        code, out, err = run(first, command, PROBE_TIMEOUT)
    except MgpuError as e:
        report.ssh = "failed"
        report.problems.append(str(e))
        report.error = e
        return report
    report.ssh = "local" if first.local else "ok"
    result = last_json(out)
    if result is None:
        detail = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit code {code}"])[-1]
        report.problems.append(f"the check did not run: {detail}")
        return report
    if result.get("workdir_missing"):
        report.problems.append(f"no directory {first.workdir}")
    elif result.get("program_missing"):
        report.problems.append(f"{probe.program} not found")
    elif result.get("python_missing"):
        report.problems.append(f"{probe.python} not found")
    if "python" not in result:
        return report
    report.python = result["python"]
    if "tensorflow" in result:
        report.tensorflow = result["tensorflow"]
    elif probe.python_required:
        report.tensorflow = "missing"
        if probe.tensorflow_required:
            report.problems.append(f"tensorflow does not import: {result.get('tensorflow_error', '?')}")
    if probe.legacy_keras:
        _check_tf_keras(report, result)
    for module in result.get("missing_modules", []):
        report.problems.append(f"cannot import {module}")
    busy = result.get("busy_ports", [])
    report.ports = ",".join(str(p) for p in ports) + (" busy" if busy else " free") if ports else "-"
    if busy:
        report.problems.append("port " + ",".join(str(p) for p in busy) + " in use")
    gpus = result.get("gpus")
    report.gpus = "-" if gpus is None else str(gpus)
    return report


def last_json(out: bytes) -> dict | None:
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _compare_tensorflow(reports: Sequence[HostReport], local_version: str | None) -> None:
    versions = [r.tensorflow for r in reports if r.tensorflow not in ("-", "missing")]
    if not versions:
        return
    reference, where = (local_version, "this machine") if local_version else (versions[0], reports[0].host)
    for report in reports:
        if report.tensorflow not in ("-", "missing", reference):
            report.problems.append(f"tensorflow {report.tensorflow} differs from {reference} on {where}")


def check_hosts(plans: Sequence[TaskPlan], ssh_runner=None, local_version: str | None = None) -> list[HostReport]:
    """Check every host of `plans` in parallel; one report per host, in plan order.

    `ssh_runner` (a runners.ssh.SshRunner) reaches remote hosts; local ones are probed directly.
    """
    hosts: dict[tuple[str, bool], list[TaskPlan]] = {}
    for plan in plans:
        hosts.setdefault((plan.host, plan.local), []).append(plan)

    def run(plan: TaskPlan, command: str, timeout: float):
        if plan.local:
            return _run_local(plan, command, timeout)
        if ssh_runner is None:
            raise ConnectError(f"{plan.host}: no SSH runner to reach it")
        return ssh_runner.run(plan, command, timeout)

    reports = in_parallel([lambda group=group: _check_host(group, run) for group in hosts.values()], _PARALLEL_PROBES)
    _compare_tensorflow(reports, local_version)
    return reports


T = TypeVar("T")


def in_parallel(jobs: Sequence[Callable[[], T]], limit: int) -> list[T]:
    """Run `jobs`, up to `limit` at once; their results in order, or the first job's error.

    The threads are daemons: an interrupt (Ctrl-C) returns at once instead of
    waiting out every probe's timeout, as leaving a ThreadPoolExecutor would,
    and interpreter exit does not wait for them either.
    """
    results: list = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)
    pending = iter(range(len(jobs)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                results[i] = jobs[i]()
            except BaseException as e:  # re-raised in the caller's thread
                errors[i] = e

    threads = [threading.Thread(target=work, daemon=True, name="mgpu-check") for _ in range(min(limit, len(jobs)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


COLUMNS = (("HOST", "host"), ("TASKS", "tasks"), ("SSH", "ssh"), ("PYTHON", "python"),
           ("TENSORFLOW", "tensorflow"), ("PORTS", "ports"), ("GPUS", "gpus"), ("RESULT", "reason"))


def render_table(reports: Sequence[HostReport]) -> str:
    columns = list(COLUMNS)
    if any(r.tf_keras != "-" for r in reports):  # only runs with --legacy-keras check it
        columns.insert(5, ("TF_KERAS", "tf_keras"))
    rows = [[title for title, _ in columns]]
    for r in reports:
        values = []
        for _, attr in columns:
            value = getattr(r, attr)
            values.append(",".join(value) if isinstance(value, tuple) else str(value))
        rows.append(values)
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows
    )


def raise_for_failures(reports: Sequence[HostReport]) -> None:
    failed = [r for r in reports if not r.ok]
    if not failed:
        return
    # A connection problem keeps its own type (ConnectError, HostKeyError); bad input (exit 2) comes first.
    errors = sorted((r.error for r in failed if r.error is not None), key=lambda e: not isinstance(e, UsageError))
    if errors:
        raise errors[0]
    if len(failed) == 1:
        raise CheckFailed(f"check failed on {failed[0].host}: {failed[0].reason}")
    raise CheckFailed(f"check failed on {len(failed)} hosts: " + ", ".join(r.host for r in failed))


def run_checks(plans: Sequence[TaskPlan], ssh_runner, console: TextIO | None = None) -> list[HostReport]:
    """The pre-launch check: print the table and raise if a host fails, else one summary line."""
    console = console or sys.stderr
    started = time.monotonic()
    reports = check_hosts(plans, ssh_runner, local_tensorflow_version())
    failed = sum(not r.ok for r in reports)
    if not failed:
        console.write(f"mgpu: checked {len(reports)} host(s) in {time.monotonic() - started:.1f} s: ok\n")
    elif failed > 1:  # the error line names one failure only; the table shows them all
        console.write(render_table(reports) + "\n")
    console.flush()
    raise_for_failures(reports)
    return reports
