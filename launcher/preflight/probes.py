"""The command lines that run the probe on each host, and what its host check asks of a task's host.

Each runs the probe (launcher/host/probe/, standard library only, shipped as one source) with the
interpreter the tasks will use there, so a host is judged by the Python its tasks get: the host
check (which Python, TensorFlow, modules, free ports, GPUs), the reachability test (listen on the
tasks' ports, connect to every task's address, and list the host's addresses by interface) and the
speed probe (a transfer to the next host of a ring, a matrix product).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import sys
from typing import Iterable, Sequence

from launcher.backends.ssh.handover import handover_script
from launcher.host.probe import probe_source
from launcher.plan.planner import LEGACY_KERAS_ENV, TRAINER_MODULE, TaskPlan
from launcher.shell import one_line, safe_workdir, sh


@dataclasses.dataclass(frozen=True)
class TaskNeeds:
    """What the host check asks of a task's host, from the task's command line."""

    program: str  # the task's program: it must exist
    python: str  # the interpreter that runs the probe
    python_required: bool  # whether the tasks need that interpreter too
    modules: tuple[str, ...]  # modules the tasks import
    legacy_keras: bool = False
    tensorflow_required: bool = False
    script: str | None = None  # the script a Python command runs, whose imports are looked up
    module: str | None = None  # or the module it runs (-m)
    # The task's own variables that decide which program and modules it finds (PATH, PYTHONPATH...).
    search_env: tuple[tuple[str, str], ...] = ()


# The variables of a task's env by which its shell finds the program and its Python finds modules:
# the check runs with them as the task will.
SEARCH_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH",
              "VIRTUAL_ENV")
SEARCH_ENV_END = "mgpu-search-env-end"
# Python's own options that take the next argument as their value.
_PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def python_program(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(script, module) of a Python command line: what `python [options] script.py` or `python -m
    module` runs; neither for `-c` or an interactive interpreter."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "-"):
            return None, None
        if arg == "-m":
            return None, argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m"):
            return None, arg[2:]
        if not arg.startswith("-"):
            return arg, None
        i += 2 if arg in _PYTHON_OPTIONS_WITH_VALUE else 1
    return None, None


def needs_of(plan: TaskPlan) -> TaskNeeds:
    """What the host check asks of the host of `plan`."""
    argv = plan.argv
    legacy_keras = plan.env.get(LEGACY_KERAS_ENV) == "1"
    if len(argv) >= 3 and argv[1:3] == ("-m", TRAINER_MODULE):
        return TaskNeeds(argv[0], argv[0], True, (TRAINER_MODULE,), legacy_keras, tensorflow_required=True)
    search_env = tuple((name, plan.env[name]) for name in SEARCH_ENV if name in plan.env)
    if os.path.basename(argv[0]).startswith("python"):
        script, module = python_program(argv)
        return TaskNeeds(argv[0], argv[0], True, (), legacy_keras, tensorflow_required=legacy_keras,
                         script=script, module=module, search_env=search_env)
    # Some other program: Python is only used for the probe itself, and may be absent.
    return TaskNeeds(argv[0], "python3", legacy_keras, (), legacy_keras, tensorflow_required=legacy_keras,
                     search_env=search_env)


def host_check_command(needs: TaskNeeds, ports: Iterable[int], workdir: str | None, reach: Sequence[str] = (),
                       speed: Sequence[str] = (), import_tensorflow: bool = False, handover: bool = False) -> str:
    """A command that checks a host with the probe and prints one JSON object on stdout.

    Keys: workdir_missing, program_missing, python_missing (true when so), else those of the
    probe (host/probe/main.py), whose source runs with the task's Python. With `reach` (the
    reachability test's arguments: reach_args), the same process runs that test first and adds
    its answer under the key reach: one session per host for both. With `speed` (speed_args), the
    speed probe runs last, its answer under the key speed. With `import_tensorflow`, TensorFlow is
    imported where the tasks require it, not only its version read. With `handover`, the session
    then waits to start the host's first task (backends/ssh/handover.py), in the directory it began in.
    """
    port_list = ",".join(str(int(p)) for p in ports)
    lines = ["mgpu_dir=$PWD"] if handover else []
    if needs.search_env:  # the values come on stdin (search_env_input), never on a command line
        lines += ["mgpu_nl='\n'",
                  f'while IFS= read -r mgpu_line; do [ "$mgpu_line" = {SEARCH_ENV_END} ] && break; '
                  'eval "export $mgpu_line"; done']
    if workdir:
        lines.append(f"cd {shlex.quote(safe_workdir(workdir))} 2>/dev/null || {{ echo '{{\"workdir_missing\": true}}'; exit 0; }}")
    lines.append(
        f"command -v {shlex.quote(needs.program)} >/dev/null 2>&1 || {{ echo '{{\"program_missing\": true}}'; exit 0; }}"
    )
    missing = '{"python_missing": true}' if needs.python_required else "{}"
    lines.append(f"command -v {shlex.quote(needs.python)} >/dev/null 2>&1 || {{ echo '{missing}'; exit 0; }}")
    run = shlex.join((needs.python, "-c", probe_source(), *(list(reach) + ["check"] if reach else []),
                      port_list, ",".join(needs.modules),
                      *(["legacy-keras"] if needs.legacy_keras else []),
                      *(["import-tensorflow"] if import_tensorflow and needs.tensorflow_required else []),
                      *_program_flags(needs), "own-name", *speed))
    if handover:
        return sh("\n".join(lines + handover_script(run)))
    # The reachability test listens on stdin (host/probe/reach_test.py: ALL_DIALED).
    lines.append("TF_CPP_MIN_LOG_LEVEL=3 exec " + run + ("" if reach else " </dev/null"))
    return sh("\n".join(lines))


def search_env_input(needs: TaskNeeds) -> bytes:
    """What the check's shell reads first on its stdin: the task's own variables that find its
    program and modules (host_check_command), so that the check finds them as the task will."""
    lines = [f"{name}={one_line(value)}" for name, value in needs.search_env if name in SEARCH_ENV]
    return ("\n".join(lines + [SEARCH_ENV_END]) + "\n").encode("utf-8", "surrogateescape")


def _program_flags(needs: TaskNeeds) -> list[str]:
    """The host check's flags that look at the task's own Python program (host/probe/program_check.py)."""
    if not needs.python_required or needs.modules:  # no Python, or the built-in trainer, checked by its module
        return []
    if needs.script:
        return [f"script={needs.script}"]
    return [f"module={needs.module}"] if needs.module else ["program"]


def reach_args(ports: Sequence[int], targets: Sequence[str], timeout: float, expected: Sequence[int]) -> list[str]:
    """The arguments of the probe's reachability test (its `reach` mode); `expected`: per
    port, how many hosts dial it."""
    return ["reach", ",".join(map(str, ports)), ",".join(targets), f"{timeout:g}", ",".join(map(str, expected))]


def reach_test_command(plan: TaskPlan, ports: Sequence[int], targets: Sequence[str], timeout: float,
                        expected: Sequence[int], speed: Sequence[str] = ()) -> str:
    """The reachability test alone for the host of `plan` (see host/probe/main.py's `reach`), and with
    `speed` (speed_args) the speed probe after it, its answer under the key speed.

    Another host runs it with the tasks' Python; this machine with the launcher's own, or for the
    speed probe with the tasks' where they run Python and it is found (its numpy, torch or
    TensorFlow are what is timed)."""
    python = needs_of(plan).python
    if plan.local and not (speed and needs_of(plan).python_required and shutil.which(python)):
        python = sys.executable
    argv = [python, "-c", probe_source(), *reach_args(ports, targets, timeout, expected), *speed]
    return sh("TF_CPP_MIN_LOG_LEVEL=3 exec " + shlex.join(argv))  # stdin: see reach_test.py's ALL_DIALED


def speed_args(port: int | None, target: str | None, timeout: float) -> list[str]:
    """The arguments of the probe's speed probe (its `speed` mode): listen on `port` for the
    previous host of the ring, send to `target`; neither on a lone host."""
    return ["speed", "-" if port is None else str(port), target or "-", f"{timeout:g}"]
