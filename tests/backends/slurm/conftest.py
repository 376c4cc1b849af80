"""Fixtures for the Slurm tests: a real one-node Slurm cluster (see slurm_helpers.py)."""

from __future__ import annotations

import pathlib
import socket
import sys
from typing import Iterator

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # for `import slurm_helpers`

from slurm_helpers import Node, SlurmLab, start_slurm  # noqa: E402


@pytest.fixture(scope="session")
def slurm_lab(tmp_path_factory) -> Iterator[SlurmLab]:
    """One node named as this machine (so TF_CONFIG's addresses resolve here), 16 CPUs and 3 GPUs
    (device files only) to Slurm."""
    try:
        socket.gethostbyname(socket.gethostname())
    except OSError:
        pytest.fail(f"this machine's name {socket.gethostname()!r} does not resolve: add it to /etc/hosts")
    lab = start_slurm(tmp_path_factory.mktemp("slurm"), (Node(socket.gethostname(), "127.0.0.1"),), cpus=16, gpus=3)
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def slurm(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    """The cluster, with no job left over from the test before."""
    slurm_lab.run("scancel", "--full", "--user", "root")
    slurm_lab.wait_no_jobs()
    yield slurm_lab
