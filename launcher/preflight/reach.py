"""Preflight reachability: can every task open a TCP connection to every other task's TF_CONFIG address?

On every host of the cluster at the same time (so that the listeners exist while the
connections are made), host/probe.py in its `reach` mode listens on that host's task ports
and connects to every cluster address. One line per broken pair, e.g.
`worker:0 on h1 cannot connect to worker:1 at h2:2222: timed out after 5 s (10.0.0.5)`.
Local hosts are probed with a subprocess, remote ones through the SSH runner; the whole
test is bounded by the connect timeout plus the probe's hold time and the SSH start-up.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from typing import Sequence

from launcher.config.addresses import format_address
from launcher.errors import CheckFailed, MgpuError
from launcher.host import probe as host_probe
from launcher.plan.planner import TaskPlan
from launcher.preflight import check as host_check
from launcher.runners.ssh import remote_command

REACH_TIMEOUT = 5.0  # seconds each connection gets
_RUN_TIMEOUT = REACH_TIMEOUT + host_probe.REACH_HOLD + 30.0  # the probe, plus a slow SSH session start
HINT = (
    "hint: the tasks dial each other at their TF_CONFIG addresses: open those ports in the firewall "
    "between the hosts, and make every host resolve those names (an ssh-config alias is written as "
    "its HostName unless --keep-host-names; others need DNS or /etc/hosts), or give `address:` per host in a spec"
)


@dataclasses.dataclass(frozen=True)
class _Host:
    plans: tuple[TaskPlan, ...]  # its cluster tasks

    @property
    def first(self) -> TaskPlan:
        return self.plans[0]

    @property
    def names(self) -> str:
        return ",".join(p.name for p in self.plans)

    @property
    def ports(self) -> list[int]:
        return [p.port for p in self.plans if p.port is not None]


def _target(plan: TaskPlan) -> str:
    return format_address(plan.reach_host, plan.port)


def _hosts(plans: Sequence[TaskPlan]) -> list[_Host]:
    grouped: dict[tuple[str, bool], list[TaskPlan]] = {}
    for plan in plans:
        if plan.port is not None:  # the evaluator is not in the cluster: no port, dials no one
            grouped.setdefault((plan.host, plan.local), []).append(plan)
    return [_Host(tuple(group)) for group in grouped.values()]


def _command(python: str, host: _Host, targets: Sequence[str], expected: int) -> list[str]:
    args = ["reach", ",".join(map(str, host.ports)), ",".join(targets), f"{REACH_TIMEOUT:g}", str(expected)]
    return [python, "-c", host_check.probe_source(), *args]


def _run(host: _Host, targets: Sequence[str], expected: int, ssh_runner) -> dict:
    """The probe's JSON result on `host`; raises MgpuError when it could not run."""
    if host.first.local:
        argv = _command(sys.executable, host, targets, expected)
        try:
            done = subprocess.run(argv, capture_output=True, timeout=_RUN_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise CheckFailed(f"{host.first.host}: the reachability probe did not finish") from e
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        python = host_check.probe_python(host.first)
        command = remote_command.sh(shlex.join(_command(python, host, targets, expected)) + " </dev/null")
        code, out, err = ssh_runner.run(host.first, command, _RUN_TIMEOUT)
    result = host_check.last_json(out)
    if result is None:
        detail = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit code {code}"])[-1]
        raise CheckFailed(f"{host.first.host}: the reachability probe did not run: {detail}")
    return result


def reachability_problems(plans: Sequence[TaskPlan], ssh_runner=None) -> list[str]:
    """One line per task pair that cannot connect (or port that cannot be listened on); [] when all can."""
    hosts = _hosts(plans)
    if not hosts:
        return []
    members = [plan for host in hosts for plan in host.plans]
    targets = [_target(plan) for plan in members]
    owner = {_target(plan): plan for plan in members}
    jobs = [lambda host=host: _run(host, targets, len(hosts), ssh_runner) for host in hosts]
    try:  # every host at once: its listeners must be up while the others connect
        results = host_check.in_parallel(jobs, len(jobs))
    except MgpuError as e:
        return [str(e)]
    problems = []
    for host, result in zip(hosts, results):
        for port, reason in sorted(result.get("listen_errors", {}).items()):
            if "in use" in reason:
                continue  # a busy port is reported by the host check and the supervisor, in their words
            problems.append(f"{host.names} on {host.first.host} cannot listen on port {port}: {reason}")
        for target, outcome in result.get("reach", {}).items():
            if outcome == "ok":
                continue
            peer = owner[target]
            if outcome.startswith("cannot resolve "):
                problems.append(f"{host.names} on {host.first.host} {outcome} ({peer.name} at {target})")
            else:
                problems.append(f"{host.names} on {host.first.host} cannot connect to {peer.name} at {target}: {outcome}")
    return problems


def check_reachability(plans: Sequence[TaskPlan], ssh_runner=None) -> None:
    """Raise CheckFailed listing every broken pair, with a hint, when a task cannot reach another."""
    problems = reachability_problems(plans, ssh_runner)
    if problems:
        raise CheckFailed("tasks cannot reach each other:\n" + "\n".join(problems) + "\n" + HINT)
