"""Rendering of plans: dry-run text and JSON, tf-config output, and the record run.json keeps.

One serialisation of a TaskPlan (plan_to_dict) serves run.json and dry-run JSON alike.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Sequence

from launcher.config.addresses import format_address
from launcher.config.spec import SshSettings
from launcher.plan.planner import TaskPlan
from launcher.protocol import KERAS_DISTRIBUTION_ENV

# What `--dry-run --json` shows of each task.
DRY_RUN_FIELDS = ("type", "index", "host", "port", "local", "argv", "env", "tf_config")


def plan_to_dict(plan: TaskPlan) -> dict[str, Any]:
    """Everything a plan holds, as JSON-ready values."""
    return {
        "name": plan.name,
        "type": plan.type,
        "index": plan.index,
        "host": plan.host,
        "port": plan.port,
        "local": plan.local,
        "ssh": dataclasses.asdict(plan.ssh) if plan.ssh is not None else None,
        "argv": list(plan.argv),
        "env": dict(plan.env),
        "tf_config": plan.tf_config,
        "workdir": plan.workdir,
        "waits_for_ready": plan.waits_for_ready,
        "slurm_rank": plan.slurm_rank,
    }


def plan_to_json(plans: Sequence[TaskPlan]) -> dict:
    """The `--dry-run --json` document."""
    tasks = []
    for plan in plans:
        record = plan_to_dict(plan)
        tasks.append({field: record[field] for field in DRY_RUN_FIELDS})
    return {"tasks": tasks}


def describe_start(plan: TaskPlan) -> str:
    """How a task would start: `local`, or `ssh [user@]host[:port]` (gaps come from ~/.ssh/config)."""
    if plan.local:
        return "local"
    if plan.slurm_rank is not None:
        return f"srun task {plan.slurm_rank}"
    ssh = plan.ssh or SshSettings()
    target = (f"{ssh.user}@" if ssh.user else "") + format_address(plan.host, ssh.port)
    via = f" via {ssh.proxy_jump}" if ssh.proxy_jump else ""
    return f"ssh {target}{via}"


def render_plan_text(plans: Sequence[TaskPlan]) -> str:
    lines = [f"Dry run: {len(plans)} task(s); nothing is started.", ""]
    for plan in plans:
        where = format_address(plan.host, plan.port)
        lines.append(f"{plan.name}  {where}  ({describe_start(plan)})")
        lines.append(f"  command:   {shlex.join(plan.argv)}")
        if plan.workdir:
            lines.append(f"  workdir:   {plan.workdir}")
        added = [f"{name}={shlex.quote(value)}" for name, value in plan.env.items() if name != "TF_CONFIG"]
        lines.append("  env:       " + ("\n             ".join(added) if added else "(none)"))
        lines.append("  TF_CONFIG:")
        lines += ["    " + line for line in _pretty_tf_config(plan.tf_config)]
        lines.append("")
    return "\n".join(lines)


def _pretty_tf_config(tf_config: dict) -> list[str]:
    """TF_CONFIG with one line per role, which stays readable for long host lists."""
    roles = [f"    {json.dumps(role)}: {json.dumps(hosts)}" for role, hosts in tf_config["cluster"].items()]
    return ["{", '  "cluster": {', *_joined(roles), "  },", f'  "task": {json.dumps(tf_config["task"])}', "}"]


def _joined(lines: list[str]) -> list[str]:
    return [line + ("," if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


def render_tf_config(plan: TaskPlan, fmt: str) -> str:
    """`json`: TF_CONFIG. `env`: its shell `export` line. `keras-env`: `export` lines of the Keras
    distribution variables, one per line; none for a task outside the job (the evaluator)."""
    if fmt == "env":
        return f"export TF_CONFIG={shlex.quote(plan.env['TF_CONFIG'])}"
    if fmt == "keras-env":
        return "\n".join(f"export {name}={shlex.quote(plan.env[name])}"
                         for name in KERAS_DISTRIBUTION_ENV if name in plan.env)
    return json.dumps(plan.tf_config, indent=2)
