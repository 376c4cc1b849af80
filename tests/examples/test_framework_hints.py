"""The hints for PyTorch's and JAX's start-up errors match what the installed frameworks really print."""

import os
import subprocess
import sys

import pytest

from launcher.supervise.fixes import hints

TORCH_ENV_INIT = "import torch.distributed as dist; dist.init_process_group('gloo', init_method='env://')"
JAX_INIT = "import jax; jax.distributed.initialize()"
JOB_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def failure_lines(code, **env):
    base = {name: value for name, value in os.environ.items() if name not in JOB_NAMES}
    done = subprocess.run([sys.executable, "-c", code], env={**base, "JAX_PLATFORMS": "cpu", **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout
    return done.stderr.splitlines()


@pytest.mark.slow
def test_torch_without_rank_gets_the_torch_hint():
    found = hints(failure_lines(TORCH_ENV_INIT))
    assert len(found) == 1 and "RANK" in found[0] and "MASTER_ADDR" in found[0] and "--format torch-env" in found[0]


@pytest.mark.slow
def test_jax_without_a_coordinator_gets_the_coordinator_hint():
    found = hints(failure_lines(JAX_INIT))
    assert len(found) == 1 and "JAX_COORDINATOR_ADDRESS" in found[0] and "--format jax-env" in found[0]


@pytest.mark.slow
def test_jax_with_only_the_coordinator_gets_the_recipe():
    """What a program that calls initialize() with no arguments prints under mgpu before it passes the rest."""
    found = hints(failure_lines(JAX_INIT, JAX_COORDINATOR_ADDRESS="127.0.0.1:1"))
    assert len(found) == 1
    assert 'num_processes=int(os.environ["JAX_NUM_PROCESSES"])' in found[0]
    assert 'process_id=int(os.environ["JAX_PROCESS_ID"])' in found[0]
