"""What the host check judges of the task's own program (host/probe/program_check.py's answer): the
interpreter that runs it and the modules it imports that this interpreter cannot find, and, for a
JAX program across hosts, a host whose own name resolves to a loopback address.

A `python3` on a command line is the one the task's shell finds, which need not be the one the
user installed into (a venv, `--python`, another host's PATH): the check runs the same program,
found the same way, and names it.

JAX's Gloo collectives (CPU) listen on the address the host's own name resolves to and tell every
other process to connect there; JAX takes no interface or address for them, so a host whose name
is 127.0.1.1 (Debian's /etc/hosts) or 127.0.0.1 makes every other host's connection time out after
minutes. PyTorch's Gloo and NCCL take the interface the reachability test found (plan/network.py).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from launcher.preflight.host_report import HostReport
    from launcher.preflight.probes import TaskNeeds

KERAS_BACKEND_ENV = "KERAS_BACKEND"


def judge_program(report: "HostReport", needs: "TaskNeeds", result: Mapping) -> None:
    """The interpreter the tasks run, and a problem for each module their program imports that it
    cannot find."""
    if "executable" in result:
        report.interpreter = result["executable"]
    if "own_name" in result:
        report.own_name = {key: result[key] for key in ("own_name", "own_addresses", "own_name_error")
                           if key in result}
    report.imports = tuple(result.get("imports", ()))
    if "keras_backend" in result:
        report.keras_backend = result["keras_backend"]
    what = needs.script or needs.module
    for name in result.get("imports_missing", ()):
        report.problems.append(f"no module {name} for {report.interpreter}, the {needs.program} that runs the "
                               f"tasks ({what} imports it): install it there, or name the interpreter that "
                               f"has it in the command")


def uses_jax(imports: Sequence[str], keras_backend: str | None) -> bool:
    """Whether a program that imports `imports` runs JAX: itself, or Keras 3 on its JAX backend."""
    return "jax" in imports or ("keras" in imports and keras_backend == "jax")


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def judge_own_names(reports: Sequence["HostReport"], env: Mapping[str, str], hosts: int) -> None:
    """On more than one host, a JAX program's host whose own name resolves only to loopback
    addresses fails its check: its peers would wait minutes for it and time out."""
    if hosts < 2:
        return
    for report in reports:
        result = report.own_name or {}
        addresses = result.get("own_addresses") or []
        backend = report.keras_backend or env.get(KERAS_BACKEND_ENV)
        if not report.imports or not uses_jax(report.imports, backend) or "own_name" not in result:
            continue
        name = result["own_name"]
        if not addresses:
            report.problems.append(
                f"its own name {name} does not resolve there ({result.get('own_name_error', 'no address')}), "
                f"and JAX's Gloo collectives listen on its address: map {name} to the address the other hosts "
                f"reach in its /etc/hosts")
        elif all(_loopback(address) for address in addresses):
            report.problems.append(
                f"its own name {name} resolves to {', '.join(addresses)} there, where JAX's Gloo collectives "
                f"would listen and no other host can reach them (they time out after minutes): map {name} to "
                f"the address the other hosts reach in its /etc/hosts (not 127.0.1.1)")


def interpreters_line(reports: Sequence["HostReport"], program: str) -> str | None:
    """The one line that names the interpreter the tasks run on each host, or None when none was found."""
    found: dict[str, list[str]] = {}
    for report in reports:
        if report.interpreter != "-":
            found.setdefault(f"{report.interpreter} (Python {report.python})", []).append(report.host)
    if not found:
        return None
    named = "" if list(found) == [f"{program} (Python {reports[0].python})"] else f"{program}, "
    return f"the tasks run {named}" + "; ".join(f"{where} on {', '.join(hosts)}" for where, hosts in found.items())
