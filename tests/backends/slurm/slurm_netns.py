"""A Slurm cluster whose nodes are network namespaces of our own (one slurmd each, slurmctld in the
root namespace), for the tests that run jobs across several nodes."""

from __future__ import annotations

import os
import pathlib
import shlex
import socket
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ssh"))  # the network-namespace lab

from slurm_helpers import REQUIRE, Node, start_slurm  # noqa: E402
from netns_hosts import Netns  # noqa: E402
from ssh_helpers import require_tools  # noqa: E402


def slurm_lab(tmp_path_factory, names: tuple[str, ...], slurmd_timeout: int = 30, message_timeout: int = 10):
    """Yield a started cluster of the nodes `names` (see start_slurm for the timeouts); stopped after."""
    require_tools("ip")
    if os.geteuid() != 0:
        if REQUIRE:
            pytest.fail("network namespaces need root and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip("network namespaces need root")
    lab = Netns.create(names)
    slurm = None
    try:
        nodes = tuple(Node(name, address, lab.namespaces[name]) for name, address in lab.hosts.items())
        slurm = start_slurm(tmp_path_factory.mktemp(f"slurm{len(names)}"), nodes,
                            controller=f"{socket.gethostname()}({lab.subnet}.1)", slurmd_timeout=slurmd_timeout,
                            message_timeout=message_timeout)
        yield slurm
    finally:
        if slurm is not None:
            slurm.stop()
        lab.destroy()


def sbatch_wait(lab, tmp_path, argv, nodes: int) -> str:
    """Run `argv` as the batch script of a job on `nodes` nodes, wait for it, and return its output;
    the job must succeed."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    done = lab.run("sbatch", "--wait", f"--nodes={nodes}", "--ntasks-per-node=1", "--time=10",
                   f"--output={tmp_path}/job.out", str(script), cwd=tmp_path, timeout=300)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert done.returncode == 0, done.stderr + output[-4000:] + lab.log_tail()
    return output
