"""Pre-launch host checks (`mgpu check`, and `mgpu launch` before starting remote tasks).

For every host, in parallel: can we log in; does the task's program exist;
which Python, and does it import the built-in trainer when the tasks run it; is TensorFlow
installed with the same version as on this machine (or, without TensorFlow here, as on the
first host); `mgpu check` imports it too where the tasks require it (seconds, more with CUDA),
while `mgpu launch` reads its version from package metadata only: a TensorFlow that is installed
but does not import fails the task itself within seconds, named with its error, and a launch does
not pay the import twice at every start. Are the tasks' ports free; how many GPUs
does nvidia-smi list; with --legacy-keras (TF_USE_LEGACY_KERAS=1 in the plan), does tf_keras
import, of the host's TensorFlow series. One table row per host; any failure raises. TensorFlow
is required by the built-in trainer and by --legacy-keras: another program may not use it (a
Keras 3 program on the JAX backend, say), so there it is shown, not demanded.

This module never imports paramiko or TensorFlow: remote hosts are probed
through a backend, local ones with a subprocess.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Sequence, TextIO

from launcher.errors import CheckFailed, ConnectError, MgpuError, UnreadableAnswer, UsageError
from launcher.host.packages import NOT_INSTALLED, installed_tensorflow_version
from launcher.plan.planner import TaskPlan
from launcher.preflight.answers import check_answer, unreadable
from launcher.preflight.host_report import HostReport
from launcher.preflight.on_host import Conversation, HostShell, by_host, in_parallel
from launcher.preflight.probes import host_check_command, needs_of, search_env_input
from launcher.preflight.program import interpreters_line, judge_own_names, judge_program
from launcher.preflight.reach import Reachability, ReachTest
from launcher.preflight.speed import SPEED_RUN_TIMEOUT, HostSpeed, ring_args, speeds_from

if TYPE_CHECKING:
    from launcher.backends.ssh.handover import Handover

# Seconds a host gets to run the probe once connected (importing TensorFlow, in `mgpu check`, takes a few).
PROBE_TIMEOUT = 90.0


def local_tensorflow_version() -> str | None:
    """The TensorFlow version installed here, read from package metadata (TensorFlow is not imported)."""
    return installed_tensorflow_version()


def legacy_keras_fix(tensorflow_version: str | None) -> str:
    """The pip command that installs the tf-keras of a TensorFlow version's series."""
    series = ".".join((tensorflow_version or "").split(".")[:2])
    return f"pip install 'tf-keras~={series}.0'" if series.count(".") == 1 else "pip install tf-keras"


def _check_tf_keras(report: HostReport, result: dict) -> None:
    """tf_keras must be installed (and import, where `mgpu check` imported it) and be of the host's
    TensorFlow series (each tf-keras requires its own)."""
    tensorflow = result.get("tensorflow")
    if "tf_keras" in result:
        report.tf_keras = result["tf_keras"]
        if tensorflow and result["tf_keras"].split(".")[:2] != tensorflow.split(".")[:2]:
            report.problems.append(f"tf_keras {result['tf_keras']} does not match tensorflow {tensorflow} "
                                   f"(--legacy-keras): {legacy_keras_fix(tensorflow)}")
    else:
        report.tf_keras = "missing"
        state = "is not installed" if result.get("tf_keras_error") == NOT_INSTALLED else "does not import"
        report.problems.append(f"tf_keras {state} (--legacy-keras needs it): {legacy_keras_fix(tensorflow)}")


def _unreachable(host_plans: Sequence[TaskPlan], error: MgpuError) -> HostReport:
    report = HostReport(host_plans[0].host, tuple(p.name for p in host_plans), ssh="failed", error=error)
    report.problems.append(str(error))
    return report


def _check_host(host_plans: Sequence[TaskPlan], shell: HostShell, reach: Sequence[str] = (),
                reach_timeout: float = 0.0, speed: Sequence[str] = (),
                conversation: Conversation | None = None, import_tensorflow: bool = False,
                handover: bool = False) -> HostReport:
    """The host's report; with `reach` (ReachTest.args), the same probe runs the reachability test
    first, its answer in the report's `reached`, and talks in `conversation` (AllDialed); with
    `speed` (ring_args), the speed probe last, its answer in the report's `measured`; with
    `handover`, a remote host's session is kept to start its first task, in the report's `handover`
    (backends/ssh/handover.py)."""
    first = host_plans[0]
    report = HostReport(first.host, tuple(p.name for p in host_plans))
    needs = needs_of(first)
    ports = [p.port for p in host_plans if p.port is not None]
    handover = handover and not first.local and conversation is not None  # the conversation keeps stdin open
    if needs.search_env:  # the task's PATH and the like, on stdin, first
        conversation = conversation or Conversation(lambda line: None)
        conversation.say(search_env_input(needs))
    command = host_check_command(needs, ports, first.workdir, reach, speed, import_tensorflow, handover)
    try:
        output = shell.run(first, command, PROBE_TIMEOUT + reach_timeout + (SPEED_RUN_TIMEOUT if speed else 0.0),
                           conversation=conversation, handover=handover)
    except UnreadableAnswer as e:  # too long: the host was reached
        report.ssh, report.error = ("local" if first.local else "ok"), e
        report.problems.append(str(e))
        return report
    except MgpuError as e:
        return _unreachable(host_plans, e)
    report.ssh = "local" if first.local else "ok"
    report.handover = output.handover
    try:
        result = output.last_json()
        if result is None:
            report.problems.append(f"the check did not run: {output.last_error_line()}")
            return report
        result = check_answer(result)
    except UnreadableAnswer as e:  # its reason: the host is named here
        report.error = unreadable(first.host, "check", str(e))
        report.problems.append(str(report.error))
        return report
    if reach:
        report.reached = result.get("reach")
    if speed:
        report.measured = result.get("speed")
    if result.get("workdir_missing"):
        report.problems.append(f"no directory {first.workdir}")
    elif result.get("program_missing"):
        report.problems.append(f"{needs.program} not found")
    elif result.get("python_missing"):
        report.problems.append(f"{needs.python} not found")
    if "python" not in result:
        return report
    report.python = result["python"]
    judge_program(report, needs, result)
    if "tensorflow" in result:
        report.tensorflow = result["tensorflow"]
    elif needs.python_required:
        report.tensorflow = "missing"
        if needs.tensorflow_required:
            error = result.get("tensorflow_error", "?")
            report.problems.append("tensorflow is not installed" if error == NOT_INSTALLED
                                   else f"tensorflow does not import: {error}")
    if needs.legacy_keras:
        _check_tf_keras(report, result)
    for module in result.get("missing_modules", []):
        report.problems.append(f"cannot import {module}")
    busy = result.get("busy_ports", [])
    report.ports = ",".join(str(p) for p in ports) + (" busy" if busy else " free") if ports else "-"
    if busy:
        report.problems.append("port " + ",".join(str(p) for p in busy) + " in use")
    gpus = result.get("gpus")
    report.gpus = "-" if gpus is None else str(gpus)
    report.py_spy = result.get("py_spy")
    return report


def py_spy_notes(reports: Sequence[HostReport]) -> list[str]:
    """A line for each host where `mgpu stacks` finds no py-spy: it still runs, and a stall's stacks
    come from SIGABRT there."""
    return [f"note: no py-spy on {r.host}: `mgpu stacks` cannot read its tasks, and a stall asks them for "
            f"their stacks with SIGABRT (pip install py-spy, with the tasks' Python or on PATH)"
            for r in reports if r.py_spy == ""]


def _compare_tensorflow(reports: Sequence[HostReport], local_version: str | None) -> None:
    versions = [r.tensorflow for r in reports if r.tensorflow not in ("-", "missing")]
    if not versions:
        return
    reference, where = (local_version, "this machine") if local_version else (versions[0], reports[0].host)
    for report in reports:
        if report.tensorflow not in ("-", "missing", reference):
            report.problems.append(f"tensorflow {report.tensorflow} differs from {reference} on {where}")


def check_hosts_and_reach(plans: Sequence[TaskPlan], reach: Sequence[TaskPlan], ssh_backend=None,
                          local_version: str | None = None, speed: bool = False, import_tensorflow: bool = False,
                          handover: bool = False) -> tuple[list[HostReport], Reachability, list[HostSpeed]]:
    """The host check of `plans` (one report per host, in plan order) and the reachability test
    between the tasks of `reach`, on every host at once; with `speed`, the speed probe of the
    hosts of `reach` too (their figures, in their order; [] without); with `import_tensorflow`,
    TensorFlow imported where the tasks require it (`mgpu check`), else its version read; with
    `handover`, each remote host's session that ran the test too is kept to start the host's first
    task, in its report's `handover` (handovers_of), for the caller to give to the SSH backend
    (SshBackend.take_handovers) or close (close_handovers); a host that failed its check starts no
    task, and its session ends with the check.

    A host that both concern runs both in one SSH session, through one probe (the test first,
    then the check, which may import TensorFlow, then the speed probe); a host of only one of them
    runs that one (the speed probe after the test). Every host's connection is opened before any
    probe starts, so that the hosts' tests start together: each host's listeners must be up while
    the others dial them. The reachability and the speeds found are meaningful only when every
    report is ok (a host that failed its check may not have answered).
    """
    shell = HostShell(ssh_backend)
    test = ReachTest.of(reach)
    all_dialed = test.all_dialed()
    firsts = [host.first for host in test.hosts]
    groups = by_host(plans)
    tested = [test.index(group[0]) for group in groups]
    untested = [i for i in range(len(test.hosts)) if i not in tested]  # in the test only: the test alone
    answers: list[dict | None] = [None] * len(test.hosts)
    measured: list[dict | None] = [None] * len(test.hosts)
    errors: list[MgpuError] = []
    unreached: list[str] = []  # hosts whose connection failed
    lost: list[str] = []  # hosts of the test only whose connection failed while their probe ran
    connected = threading.Barrier(len(groups) + len(untested) or 1)

    def connect(plan: TaskPlan) -> MgpuError | None:
        try:
            shell.connect(plan)
            return None
        except MgpuError as e:
            unreached.append(plan.host)
            return e
        finally:
            connected.wait()

    def check(group: list[TaskPlan], i: int | None) -> HostReport:
        error = connect(group[0])
        if error is not None:
            return _unreachable(group, error)
        # Without every host, the test and the ring would wait for their peers' ports in vain (the
        # launch fails on the unreached host anyway): the host check alone then, reported at once.
        if i is None or unreached:
            return _check_host(group, shell, import_tensorflow=import_tensorflow)
        try:
            report = _check_host(group, shell, test.args(i), test.run_timeout, ring_args(firsts, i) if speed else (),
                                 all_dialed.conversation(i), import_tensorflow, handover)
        finally:
            all_dialed.ended(i)
        answers[i], measured[i] = report.reached, report.measured
        return report

    def reach_alone(i: int) -> None:
        error = connect(test.hosts[i].first)
        try:
            if error is not None:
                raise error
            if unreached:
                return
            answer = test.run(i, shell, ring_args(firsts, i) if speed else (), SPEED_RUN_TIMEOUT if speed else 0.0,
                              all_dialed)
            measured[i] = answer.pop("speed", None)
            answers[i] = answer
        except MgpuError as e:
            if isinstance(e, ConnectError) and error is None:
                lost.append(test.hosts[i].first.host)
            errors.append(e)

    jobs = [lambda group=group, i=i: check(group, i) for group, i in zip(groups, tested)]
    jobs += [lambda i=i: reach_alone(i) for i in untested]
    reports = in_parallel(jobs, len(jobs))[:len(groups)]
    _compare_tensorflow(reports, local_version)
    judge_own_names(reports, reach[0].env if reach else {}, len({plan.host for plan in reach}))
    speeds = speeds_from(firsts, measured) if speed else []
    reachability = _reachability(test, answers, errors, unreached, lost)
    close_handovers([report for report in reports if not report.ok])  # they start no task
    return reports, reachability, speeds


def _reachability(test: ReachTest, answers: Sequence[dict | None], errors: Sequence[MgpuError],
                  unreached: Sequence[str], lost: Sequence[str]) -> Reachability:
    """What the reachability test found, from every host's answer, or why it could not run."""
    if errors:
        return Reachability((str(errors[0]),), {}, unreached=tuple([*unreached, *lost]))
    if unreached:
        return Reachability((f"the reachability test did not run: {', '.join(unreached)} not reached",), {},
                            unreached=tuple(unreached))
    missing = [host.first.host for host, answer in zip(test.hosts, answers) if answer is None]
    if missing:
        return Reachability(tuple(f"{host}: the reachability probe did not run" for host in missing), {})
    return test.judge(answers)


def handovers_of(reports: Sequence[HostReport]) -> list[Handover]:
    """The sessions a check kept to start each host's first task (check_hosts_and_reach with handover)."""
    return [report.handover for report in reports if report.handover is not None]


def close_handovers(reports: Sequence[HostReport]) -> None:
    """End the sessions the check of `reports` kept, unused: their hosts start no task."""
    for report in reports:
        if report.handover is not None:
            report.handover.close()
            report.handover = None


COLUMNS = (("HOST", "host"), ("TASKS", "tasks"), ("SSH", "ssh"), ("PYTHON", "python"),
           ("TENSORFLOW", "tensorflow"), ("PORTS", "ports"), ("GPUS", "gpus"), ("RESULT", "reason"))


def render_table(reports: Sequence[HostReport]) -> str:
    columns = list(COLUMNS)
    if any(r.tf_keras != "-" for r in reports):  # only runs with --legacy-keras check it
        columns.insert(5, ("TF_KERAS", "tf_keras"))
    if any(r.health != "-" for r in reports):  # only with --health-check
        columns.insert(len(columns) - 1, ("HEALTH", "health"))
    if any(r.speed != "-" for r in reports):  # only once the speed probe has run
        columns.insert(len(columns) - 1, ("SPEED", "speed"))
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


def table_json(reports: Sequence[HostReport]) -> list[dict]:
    """The table's rows as JSON objects (`mgpu check --json`): the columns, and problems for RESULT."""
    return [{"host": r.host, "tasks": list(r.tasks), "ssh": r.ssh, "python": r.python, "tensorflow": r.tensorflow,
             "tf_keras": r.tf_keras, "ports": r.ports, "gpus": r.gpus, "py_spy": r.py_spy,
             "interpreter": r.interpreter, "health": r.health, "ok": r.ok,
             "problems": list(r.problems)}
            for r in reports]


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


def run_checks(plans: Sequence[TaskPlan], ssh_backend, console: TextIO | None = None,
               reach: Sequence[TaskPlan] = (), speed: bool = False, handover: bool = False
               ) -> tuple[list[HostReport], Reachability, list[HostSpeed]]:
    """The pre-launch check: print the table and raise if a host fails, else one summary line.
    With `reach`, the reachability test between those plans' tasks runs in the same sessions
    (check_hosts_and_reach), and with `speed` the speed probe of their hosts after it: the hosts'
    reports and what the test and the probe found are returned, for the caller to judge and keep. With `handover`, those sessions are kept to start
    each host's first task, and once every check has passed they are given to `ssh_backend`
    (SshBackend.take_handovers), whose `start` starts those tasks in them."""
    console = console or sys.stderr
    started = time.monotonic()
    reports, reachability, speeds = check_hosts_and_reach(plans, reach, ssh_backend, local_tensorflow_version(), speed,
                                                          handover=handover)
    failed = sum(not r.ok for r in reports)
    if reports and not failed:
        console.write(f"mgpu: checked {len(reports)} host(s) in {time.monotonic() - started:.1f} s: ok\n")
        if line := interpreters_line(reports, plans[0].argv[0]):
            console.write(f"mgpu: {line}\n")
    elif failed > 1:  # the error line names one failure only; the table shows them all
        console.write(render_table(reports) + "\n")
    console.flush()
    raise_for_failures(reports)
    if handovers := handovers_of(reports):
        ssh_backend.take_handovers(handovers)
    return reports, reachability, speeds
