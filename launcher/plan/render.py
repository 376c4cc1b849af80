"""Rendering of plans: dry-run text and JSON, tf-config output, the record run.json keeps, and the
document a Slurm step's tasks start from.

One serialisation of a TaskPlan (plan_to_dict) serves run.json and dry-run JSON alike.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any, Iterator, Sequence

from launcher.config.addresses import format_address
from launcher.config.spec import SshSettings
from launcher.plan.planner import TaskPlan
from launcher.protocol import JAX_DISTRIBUTED_ENV, KERAS_DISTRIBUTION_ENV, TORCH_DISTRIBUTED_ENV

# What `--dry-run --json` shows of each task.
DRY_RUN_FIELDS = ("type", "index", "host", "port", "local", "argv", "env", "gpus", "tf_config")
HIDDEN = "***"  # in place of a secret env value (plan.secret_env) unless --show-secrets


def shown_env(plan: TaskPlan, show_secrets: bool) -> dict[str, str]:
    """The plan's env, with the values of plan.secret_env hidden unless `show_secrets`."""
    if show_secrets or not plan.secret_env:
        return dict(plan.env)
    return {name: HIDDEN if name in plan.secret_env else value for name, value in plan.env.items()}


def plan_to_dict(plan: TaskPlan, show_secrets: bool = False, with_tf_config: bool = True) -> dict[str, Any]:
    """Everything a plan holds, as JSON-ready values (secret env values hidden unless `show_secrets`)."""
    record = {
        "name": plan.name,
        "type": plan.type,
        "index": plan.index,
        "host": plan.host,
        "address": plan.address,
        "port": plan.port,
        "local": plan.local,
        "ssh": dataclasses.asdict(plan.ssh) if plan.ssh is not None else None,
        "argv": list(plan.argv),
        "env": shown_env(plan, show_secrets),
        "workdir": plan.workdir,
        "waits_for_ready": plan.waits_for_ready,
        "slurm_rank": plan.slurm_rank,
        "gpus": plan.gpus,
    }
    if with_tf_config:
        record["tf_config"] = plan.tf_config
    if plan.sync is not None:
        record["sync"] = sync_to_dict(plan)
    if plan.setup is not None:
        record["setup"] = {"command": plan.setup.command, "timeout": plan.setup.timeout}
    return record


def sync_to_dict(plan: TaskPlan) -> dict[str, Any]:
    """What --sync gives the plan's task: the folder here, its files and bytes, their digest, and
    where the task runs (the folder itself on this machine, its copy elsewhere)."""
    sync = plan.sync
    return {"source": sync.source, "files": len(sync.files), "bytes": sync.total_bytes, "digest": sync.digest,
            "copied_to": None if plan.local else plan.workdir}


SHOWN_SYNC_FILES = 20  # a dry run names this many files of a synced folder, then counts the rest


def _sync_and_setup_lines(plans: Sequence[TaskPlan]) -> list[str]:
    from launcher.config.sync import human_bytes

    lines = []
    sync = plans[0].sync if plans else None
    if sync is not None:
        remote = list(dict.fromkeys((p.host, p.workdir) for p in plans if not p.local))
        lines.append(f"Sync: {sync.source}: {len(sync.files)} file(s), {human_bytes(sync.total_bytes)}, "
                     f"digest {sync.digest[:16]}")
        lines.append("  to:        " + (", ".join(f"{host}:{workdir}" for host, workdir in remote)
                                        or "no remote host (this machine's tasks run in the folder)"))
        names = [f.path + (f" -> {f.link}" if f.link else "") for f in sync.files[:SHOWN_SYNC_FILES]]
        more = len(sync.files) - len(names)
        lines.append("  files:     " + "\n             ".join(names + ([f"... and {more} more"] if more else [])))
    setup = plans[0].setup if plans else None
    if setup is not None:
        hosts = list(dict.fromkeys(p.host for p in plans))
        lines.append(f"Setup: {setup.command}")
        lines.append(f"  on:        {', '.join(hosts)}, once each, in the workdir, before the tasks "
                     f"(timeout {setup.timeout:g} s)")
    return lines


def slurm_step_document(plans: Sequence[TaskPlan]) -> dict:
    """The plans of one Slurm job step as the compact document its tasks' bootstrap
    (bootstrap/slurm_task.py) reads.

    The TF cluster and whatever every task shares are written once, so the document stays small
    enough for the environment even with hundreds of tasks.
    """
    envs = [{k: v for k, v in plan.env.items() if k != "TF_CONFIG"} for plan in plans]
    # Shared by every task that has it; a task without it lists it under "unset" (the evaluator
    # lacks the Keras job variables, as long as the cluster list, that every other task shares).
    common = {k: v for k, v in envs[0].items() if all(env.get(k, v) == v for env in envs)}
    # Names some task has and another lacks: the one that lacks them (the evaluator, without RANK)
    # must not inherit them from the step's environment either.
    named = dict.fromkeys(k for env in envs for k in env)
    tasks = []
    for plan, env in zip(plans, envs):
        task = {"host": plan.host, "type": plan.type, "index": plan.index,
                "env": {k: v for k, v in env.items() if k not in common}}
        unset = [k for k in named if k not in env]
        if unset:
            task["unset"] = unset
        if list(plan.argv) != list(plans[0].argv) or plan.workdir != plans[0].workdir:
            task.update(argv=list(plan.argv), workdir=plan.workdir)
        tasks.append(task)
    return {"cluster": plans[0].tf_config["cluster"], "env": common, "tasks": tasks,
            "argv": list(plans[0].argv), "workdir": plans[0].workdir}


def iter_plan_json(plans: Sequence[TaskPlan], show_secrets: bool = False) -> Iterator[str]:
    """The `--dry-run --json` document, `{"tasks": [...]}` as json.dumps(indent=2) writes it, in
    pieces: every task repeats the whole cluster, so the document grows with the square of the
    cluster while memory stays linear. The cluster is serialised once per distinct cluster."""
    pretty_clusters: dict[str, str] = {}
    yield '{\n  "tasks": ['
    for number, plan in enumerate(plans):
        record = plan_to_dict(plan, show_secrets, with_tf_config=False)
        cluster_json, task = _cluster_and_task(plan)
        if cluster_json not in pretty_clusters:
            pretty = json.dumps(json.loads(cluster_json), indent=2)
            pretty_clusters[cluster_json] = pretty.replace("\n", "\n" + " " * 4)
        record = {field: record.get(field) for field in DRY_RUN_FIELDS + ("sync", "setup") if field in record or
                  field in DRY_RUN_FIELDS}
        record["tf_config"] = {"cluster": _CLUSTER_SLOT, "task": task}
        if plan.reached_elsewhere:  # only where other tasks dial another name than the one written
            record["address"] = plan.address
        text = json.dumps(record, indent=2).replace(json.dumps(_CLUSTER_SLOT), pretty_clusters[cluster_json], 1)
        yield ("," if number else "") + "\n    " + text.replace("\n", "\n    ")
    yield "\n  ]\n}\n" if plans else "]\n}\n"


_CLUSTER_SLOT = "\x00cluster"  # stands for the cluster while a task is serialised; no JSON value is it


def _cluster_and_task(plan: TaskPlan) -> tuple[str, dict]:
    return plan.env.cluster_json, plan.env.task


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


def iter_plan_text(plans: Sequence[TaskPlan], show_secrets: bool = False) -> Iterator[str]:
    """The dry-run text, a task at a time (secret env values hidden unless `show_secrets`)."""
    yield f"Dry run: {len(plans)} task(s); nothing is started.\n"
    extra = _sync_and_setup_lines(plans)
    if extra:
        yield "\n" + "\n".join(extra) + "\n"
    pretty_clusters: dict[str, list[str]] = {}
    for plan in plans:
        cluster_json, task = _cluster_and_task(plan)
        if cluster_json not in pretty_clusters:
            pretty_clusters[cluster_json] = _pretty_cluster(json.loads(cluster_json))
        where = format_address(plan.host, plan.port)
        if plan.reached_elsewhere:
            where += f" at {format_address(plan.address, plan.port)}"
        lines = ["", f"{plan.name}  {where}  ({describe_start(plan)})", f"  command:   {shlex.join(plan.argv)}"]
        if plan.workdir:
            lines.append(f"  workdir:   {plan.workdir}")
        env = shown_env(plan, show_secrets)
        added = [f"{name}={value if name in plan.secret_env and not show_secrets else shlex.quote(value)}"
                 for name, value in env.items() if name != "TF_CONFIG"]
        lines.append("  env:       " + ("\n             ".join(added) if added else "(none)"))
        if plan.gpus:
            lines.append(f"  GPUs:      {plan.gpus}")
        lines.append("  TF_CONFIG:")
        lines += ["    {", '      "cluster": {', *pretty_clusters[cluster_json], "      },",
                  f'      "task": {json.dumps(task)}', "    }"]
        yield "\n".join(lines) + "\n"
    yield "\n"


def render_plan_text(plans: Sequence[TaskPlan], show_secrets: bool = False) -> str:
    return "".join(iter_plan_text(plans, show_secrets))


def _pretty_cluster(cluster: dict) -> list[str]:
    """The cluster with one line per role, which stays readable for long host lists."""
    return _joined([f"        {json.dumps(role)}: {json.dumps(hosts)}" for role, hosts in cluster.items()])


def _joined(lines: list[str]) -> list[str]:
    return [line + ("," if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


# `mgpu tf-config --format`: the variables each format exports (json and env: TF_CONFIG).
EXPORT_FORMATS = {"keras-env": KERAS_DISTRIBUTION_ENV, "torch-env": TORCH_DISTRIBUTED_ENV,
                  "jax-env": JAX_DISTRIBUTED_ENV}
TF_CONFIG_FORMATS = ("json", "env", *EXPORT_FORMATS)


def render_tf_config(plan: TaskPlan, fmt: str) -> str:
    """`json`: TF_CONFIG. `env`: its shell `export` line. `keras-env`, `torch-env`, `jax-env`: `export` lines of
    that framework's distribution variables, one per line; none for a task outside the job (the
    evaluator)."""
    if fmt == "env":
        return f"export TF_CONFIG={shlex.quote(plan.env['TF_CONFIG'])}"
    if fmt in EXPORT_FORMATS:
        return "\n".join(f"export {name}={shlex.quote(plan.env[name])}"
                         for name in EXPORT_FORMATS[fmt] if name in plan.env)
    return json.dumps(plan.tf_config, indent=2)
