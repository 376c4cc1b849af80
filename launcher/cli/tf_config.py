"""`mgpu tf-config`: one task's TF_CONFIG (or its Keras, PyTorch or JAX variables), for another
scheduler, a Slurm step or a pod of `mgpu k8s`."""

from __future__ import annotations

import os
import sys

import click

from launcher.cli import params
from launcher.cli.main import cli
from launcher.cli.options import check_text, cluster_options, host_address_options, host_naming, hosts_request
from launcher.config.spec import ROLES, WORKER
from launcher.errors import UsageError
from launcher.intake.load import SlurmScope, make_plans, read_spec
from launcher.plan.render import TF_CONFIG_FORMATS


TF_CONFIG_HELP = """Print one task's TF_CONFIG, for use under another scheduler.


--format env        TF_CONFIG as a shell `export` line
--format keras-env  `export` lines of KERAS_DISTRIBUTION_*, which
                    keras.distribution.initialize() reads (Keras 3, JAX)
--format torch-env  those of RANK, WORLD_SIZE, LOCAL_RANK,
                    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the
                    rest of torchrun's contract: GROUP_RANK, NODE_RANK,
                    ROLE_*, TORCHELASTIC_* (PyTorch, Lightning)
--format jax-env    those of JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
                    JAX_PROCESS_ID (jax.distributed.initialize())

The evaluator and parameter servers are not members of the job: the last three print nothing for them.
Hosts appear as `mgpu launch` writes them: an ssh-config alias as its
HostName, unless --keep-host-names.

\b
Examples:
  mgpu tf-config --workers h1:2222,h2:2222 --task-index 1
  eval "$(mgpu tf-config --workers h1:2222,h2:2222 --task-index 0 --format env)"
  eval "$(mgpu tf-config --workers h1:2222,h2:2222 --task-index 0 --format keras-env)"
  eval "$(mgpu tf-config --workers h1:2222,h2:2222 --task-index 1 --format torch-env)"
  eval "$(mgpu tf-config --workers h1:2222,h2:2222 --task-index 1 --format jax-env)"
  mgpu tf-config --spec cluster.yaml --task-type chief --task-index 0
  srun sh -c 'eval "$(mgpu tf-config --from-slurm --format env)"; exec python train.py'
  mgpu tf-config --from-k8s --format torch-env      # inside a pod of `mgpu k8s`
"""


@cli.command("tf-config", help=TF_CONFIG_HELP)
@cluster_options(no_value_with="--from-slurm")
@click.option("--task-type", type=click.Choice(ROLES), default=WORKER, show_default=True)
@click.option("--task-index", type=params.Count(min=0), help="Which task of its type (required without --from-slurm).")
@click.option("--from-slurm", is_flag=True,
              help="Inside a Slurm job step: this task's TF_CONFIG, from SLURM_PROCID and the step's nodes, "
                   "ports from --port upward on each node (--chief, --evaluator: rank 0 is the chief, the last "
                   "rank the evaluator).")
@click.option("--format", "fmt", type=click.Choice(TF_CONFIG_FORMATS), default="json", show_default=True,
              help="json: TF_CONFIG; env: an `export TF_CONFIG='...'` line for a shell; "
                   "keras-env: `export` lines of KERAS_DISTRIBUTION_* for Keras 3 on JAX; "
                   "torch-env: those of RANK, WORLD_SIZE, MASTER_ADDR... for PyTorch; "
                   "jax-env: those of JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.")
@click.option("--from-k8s", is_flag=True,
              help="Inside a pod of `mgpu k8s`: this pod's TF_CONFIG, from JOB_COMPLETION_INDEX and the "
                   "MGPU_K8S_* variables of its manifest, as the pod bootstrap sets it.")
@host_address_options
def tf_config_command(task_type: str, task_index: int | None, fmt: str, from_slurm: bool, from_k8s: bool,
                      **opts) -> None:
    from launcher.plan.planner import select_task
    from launcher.plan.render import render_tf_config

    check_text(opts)
    if from_k8s:
        from launcher.config.k8s_env import read_pod
        from launcher.plan.planner import pod_plan

        given = [f"--{key.replace('_', '-')}" for key in ("workers", "slot_hosts", "hostfile", "spec_file", "chief",
                                                          "evaluator") if opts.get(key)]
        if given or from_slurm or task_index is not None:
            raise UsageError(f"--from-k8s takes the cluster from the pod's environment: drop "
                             f"{(given + ['--from-slurm'] * from_slurm + ['--task-index'] * (task_index is not None))[0]}")
        click.echo(render_tf_config(pod_plan(read_pod(os.environ), ("true",), sys.executable), fmt))
        return
    if from_slurm:
        from launcher.config.slurm_env import misplacement, step_rank

        plans = make_plans(read_spec(hosts_request(opts, slurm=SlurmScope.STEP)), run_id="tf-config", slurm=True)
        rank = step_rank(os.environ)
        if rank >= len(plans):
            raise UsageError(f"SLURM_PROCID {rank} is out of range: the step has {len(plans)} tasks")
        problem = misplacement(os.environ, rank, plans[rank].host)
        if problem:
            raise UsageError(problem)
        click.echo(render_tf_config(plans[rank], fmt))
        return
    if task_index is None:
        raise UsageError("give --task-index (or --from-slurm inside a Slurm job step)")
    # The same addresses as `mgpu launch` writes: ssh-config HostNames unless --keep-host-names.
    plans = make_plans(read_spec(hosts_request(opts)), run_id="tf-config", naming=host_naming(opts), count_gpus=False)
    click.echo(render_tf_config(select_task(plans, task_type, task_index), fmt))
