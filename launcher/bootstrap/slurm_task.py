"""The task side of a Slurm job step: `python -m launcher.bootstrap.slurm_task`, once per task.

srun starts this program on every node of the step. It picks its task from the plan the
launcher made (passed in MGPU_SLURM_PLAN) by SLURM_PROCID, checks that Slurm placed it on the
node the plan expects, sets TF_CONFIG and the plan's environment, and then execs the task's
program, so that Slurm's signals and exit status concern the program itself.

NCCL and Gloo are given the interface this node reaches the other nodes through (as `mgpu launch`
does elsewhere after its preflight), unless the step's environment names one.

Two hazards of TensorFlow's SlurmClusterResolver are avoided: ranks follow the node list in
Slurm's own order (never sorted by name, where node10 comes before node9), and a
CUDA_VISIBLE_DEVICES that Slurm set for the step is kept, never overwritten.

Standard library and mgpu's own pure modules only: it runs on every node before anything else is
known to work there.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Mapping

from launcher.config.slurm_env import misplacement
from launcher.host.interfaces import interface_toward
from launcher.plan.network import INTERFACE_ENV, interface_env
from launcher.plan.planner import tf_config_text
from launcher.protocol import ENV_ATTEMPT, attempt_env

# The plans (plan/render.py's slurm_step_document) travel in the environment, which every node of a
# step receives (no shared file system needed): MGPU_SLURM_PLAN holds the number of parts,
# MGPU_SLURM_PLAN_0... the JSON, in parts because Linux limits one environment string to 128 KiB.
ENV_PLAN = "MGPU_SLURM_PLAN"
PART_CHARS = 100_000
EXIT_MISPLACED = 2
EXIT_CANNOT_START = 127


def plan_environment(document: dict) -> dict[str, str]:
    """The document as environment variables (launcher side)."""
    text = json.dumps(document, separators=(",", ":"))
    parts = [text[start:start + PART_CHARS] for start in range(0, len(text), PART_CHARS)]
    return {ENV_PLAN: str(len(parts)), **{f"{ENV_PLAN}_{i}": part for i, part in enumerate(parts)}}


def read_plan_environment(environ: Mapping[str, str]) -> dict:
    """The document back from the environment; KeyError or ValueError when it is not there."""
    return json.loads("".join(environ[f"{ENV_PLAN}_{i}"] for i in range(int(environ[ENV_PLAN]))))


def task_start(document: Mapping, rank: int, environ: Mapping[str, str]) -> tuple[list[str], dict[str, str], str | None]:
    """(argv, environment, workdir) of task `rank`, over this process's environment."""
    task = document["tasks"][rank]
    env = {k: v for k, v in environ.items() if k != ENV_PLAN and not k.startswith(ENV_PLAN + "_")}
    slurm_devices = environ.get("CUDA_VISIBLE_DEVICES")
    env.update(document["env"])
    env.update(task["env"])
    for name in task.get("unset", ()):
        env.pop(name, None)
    if slurm_devices is not None:  # Slurm bound GPUs to this step: its choice stands
        env["CUDA_VISIBLE_DEVICES"] = slurm_devices
    attempt = environ.get(ENV_ATTEMPT, "")
    if attempt.isdecimal():  # srun's environment carries the attempt; the plan holds the first one's
        env.update(attempt_env(int(attempt)))
    env["TF_CONFIG"] = tf_config_text(json.dumps(document["cluster"], separators=(",", ":")),
                                      {"type": task["type"], "index": task["index"]})
    return list(task.get("argv", document["argv"])), env, task.get("workdir", document["workdir"])


def main() -> int:
    try:
        document = read_plan_environment(os.environ)
        rank = int(os.environ["SLURM_PROCID"])
        task = document["tasks"][rank]
    except (KeyError, ValueError, IndexError) as exc:
        print(f"mgpu: this program runs inside `mgpu launch --slurm` steps only ({exc!r})", file=sys.stderr)
        return EXIT_MISPLACED
    problem = misplacement(os.environ, rank, task["host"])
    if problem:
        print(f"mgpu: {task['type']}:{task['index']}: {problem}", file=sys.stderr, flush=True)
        return EXIT_MISPLACED
    argv, env, workdir = task_start(document, rank, os.environ)
    if not any(name in env for name in INTERFACE_ENV):
        interface = interface_toward([t["host"] for t in document["tasks"]], task["host"])
        if interface:
            env.update(interface_env(interface))
    try:
        if workdir:
            os.chdir(workdir)
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"mgpu: {task['type']}:{task['index']}: cannot start {argv[0]!r}: {exc.strerror or exc}",
              file=sys.stderr, flush=True)
        return EXIT_CANNOT_START
    return EXIT_CANNOT_START  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
