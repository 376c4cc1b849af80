"""Health checks (`--health-check CMD`, spec `health_check:`): a command run on a host before it runs
tasks (every host before the start, a spare before it takes over, the hosts of a failed attempt
before the restart). A host whose check exits non-zero, outlives its time or cannot be reached is
unhealthy, named with the check's last lines; the fleet leaves it out.

Before the user's command, where the host has nvidia-smi, the built-in GPU checks run: a GPU that
reports a pending recovery action (reset, reboot, drain), uncorrectable ECC errors, pages waiting
to be retired or rows that could not be remapped (the retired-page limit) makes the host unhealthy.
After a failed attempt, a GPU process still holding memory once a bounded wait is over (the attempt's
tasks free theirs as they exit) fails the host too. What nvidia-smi prints is read here, as untrusted text (`gpu_problems`, pure); on the host runs
only a fixed shell snippet.
"""

from __future__ import annotations

import shlex
from typing import Mapping, Sequence

from launcher.errors import MgpuError
from launcher.plan.planner import TaskPlan
from launcher.preflight.on_host import HostShell, by_host, in_parallel
from launcher.shell import safe_workdir, sh
from launcher.supervise.console_text import console_safe

HEALTH_CHECK_TIMEOUT = 300.0  # seconds a host's health check may take
LAST_LINES = 3  # of the check's output, named when it fails
LINE_LIMIT = 200  # characters of each of them
MAX_HOSTS_AT_ONCE = 32

# Where the user's command's output starts: the built-in checks' output is before it.
COMMAND_MARK = "mgpu-health-check:"
# Where a GPU query's output starts: the snippet prints it before each query.
QUERY_MARK = "mgpu-gpu-query:"
# The built-in GPU checks: nothing where nvidia-smi is missing. Each query on its own, so that a field
# an older driver does not know fails only its query (whose error text is then not read).
GPU_QUERIES = {
    "memory": "index,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.failure",
    "recovery": "index,gpu_recovery_action",
}
GPU_SNIPPET = "command -v nvidia-smi >/dev/null 2>&1 && {{ {queries}; }} || true".format(queries="; ".join(
    f"echo {QUERY_MARK}{name}; nvidia-smi --query-gpu={fields} --format=csv 2>/dev/null"
    for name, fields in GPU_QUERIES.items()))
# After a failed attempt: the GPUs' compute processes, waited for to end (the last attempt's tasks
# free their memory as they exit) at most HELD_WAIT seconds, then listed.
HELD_FIELDS = "pid,process_name,used_gpu_memory"
HELD_WAIT = 30
HELD_SNIPPET = ("command -v nvidia-smi >/dev/null 2>&1 && {{ i=0; while [ $i -lt {polls} ] && "
                "[ -n \"$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)\" ]; do "
                "sleep 2; i=$((i+1)); done; echo {mark}held; "
                "nvidia-smi --query-compute-apps={fields} --format=csv 2>/dev/null; }} || true").format(
    polls=HELD_WAIT // 2, mark=QUERY_MARK, fields=HELD_FIELDS)
GPU_OUTPUT_LIMIT = 1 << 16  # characters of nvidia-smi's answer read
MAX_GPUS = 1024


def gpu_problems(text: str) -> list[str]:
    """What the built-in GPU snippet's output says is wrong, one line per GPU and problem; [] where
    nothing is (or nvidia-smi answered nothing it could read: a field it does not know, no GPU)."""
    problems: list[str] = []
    query = None
    header: list[str] = []
    rows = 0
    for raw in text[:GPU_OUTPUT_LIMIT].splitlines():
        line = raw.strip()
        if line.startswith(QUERY_MARK):
            query, header = line[len(QUERY_MARK):], []
            continue
        if query not in (*GPU_QUERIES, "held") or not line:
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if not header:
            header = [cell.split(" ")[0] for cell in cells]  # "memory.used [MiB]": the field's name
            if header != (HELD_FIELDS if query == "held" else GPU_QUERIES[query]).split(","):
                query = None  # an error, or another tool's output: not read
            continue
        rows += 1
        if len(cells) != len(header) or rows > MAX_GPUS:
            continue
        row = dict(zip(header, cells))
        if query == "held":
            problems.append(f"GPU memory still held {HELD_WAIT} s after the attempt: process "
                            f"{console_safe(row['pid'][:12])} ({console_safe(row['process_name'][-60:])}, "
                            f"{console_safe(row['used_gpu_memory'][:20])})")
            continue
        gpu = f"GPU {console_safe(row['index'][:8])}"
        if query == "memory":
            ecc = row["ecc.errors.uncorrected.volatile.total"]
            if ecc.isdigit() and int(ecc) > 0:
                problems.append(f"{gpu}: {int(ecc)} uncorrectable ECC error(s) since the driver loaded")
            if row["retired_pages.pending"] == "Yes":
                problems.append(f"{gpu}: pages waiting to be retired (a reset or reboot retires them)")
            if row["remapped_rows.failure"] == "Yes":
                problems.append(f"{gpu}: a row remapping failed (the retired-page limit is reached)")
        elif query == "recovery":
            action = row["gpu_recovery_action"]
            if action and action not in ("None", "[N/A]", "[Not Supported]", "N/A"):
                problems.append(f"{gpu}: the driver asks for a recovery action: {console_safe(action[:40])}")
    return problems


def last_lines(out: bytes, err: bytes) -> str:
    """The check's last lines (stderr's, else stdout's), printable and bounded, joined by ' | '."""
    for stream in (err, out):
        lines = [line.strip() for line in stream.decode("utf-8", "replace").splitlines() if line.strip()]
        if lines:
            shown = [console_safe(line[:LINE_LIMIT] + ("..." if len(line) > LINE_LIMIT else ""))
                     for line in lines[-LAST_LINES:]]
            return " | ".join(shown)
    return "no output"


def health_script(command: str, workdir: str | None, after_attempt: bool = False) -> str:
    """What runs on the host: the built-in GPU checks (after an attempt, the wait for its GPU memory to
    be freed too), then `command` in the tasks' workdir."""
    cd = f"cd {shlex.quote(safe_workdir(workdir))} || exit 1; " if workdir else ""
    held = f"{HELD_SNIPPET}; " if after_attempt else ""
    return f"{held}{GPU_SNIPPET}; echo {COMMAND_MARK}; {cd}{command}"


def judge(code: int, out: bytes, err: bytes) -> str | None:
    """Why a host's check makes it unhealthy (its GPUs first); None when it passed."""
    gpus, _, own = out.partition(COMMAND_MARK.encode() + b"\n")
    problems = gpu_problems(gpus.decode("utf-8", "replace"))
    if problems:
        return "; ".join(problems[:4]) + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else "")
    if code != 0:
        return f"the health check exited with code {code}: {last_lines(own, err)}"
    return None


def unhealthy_hosts(plans: Sequence[TaskPlan], command: str, ssh_backend=None, after_attempt: bool = False,
                    timeout: float | None = None) -> dict[str, str]:
    """Each host of `plans` whose health check fails, with why (one line), all hosts at once;
    `after_attempt`: GPU memory still held by a process after a bounded wait fails it too;
    `timeout`: seconds for each host's check (None: HEALTH_CHECK_TIMEOUT)."""
    timeout = timeout or HEALTH_CHECK_TIMEOUT
    shell = HostShell(ssh_backend)
    groups = by_host(plans)
    if not groups:
        return {}

    def check(group: Sequence[TaskPlan]) -> str | None:
        plan = group[0]
        try:
            output = shell.run(plan, sh(health_script(command, plan.workdir, after_attempt)), timeout, what="health check")
        except MgpuError as e:
            return str(e).splitlines()[0]
        return judge(output.code, output.out, output.err)

    found = in_parallel([lambda group=group: check(group) for group in groups], min(len(groups), MAX_HOSTS_AT_ONCE))
    return {group[0].host: why for group, why in zip(groups, found) if why is not None}


def described(unhealthy: Mapping[str, str]) -> str:
    return "; ".join(f"{host}: {why}" for host, why in unhealthy.items())
