"""The soak under Slurm (benchmarks/soak.py --backend slurm): the hosts are Slurm nodes, network
namespaces with a slurmd each and slurmctld here (tests/backends/slurm/slurm_helpers.py, as the
suite's Slurm tests make them), and the run is `mgpu launch --slurm` as the batch script of a job
on every node (`sbatch --no-kill`, so that the allocation outlives a node that fails), the nodes
past --workers its spares. The faults that apply there:

- kill9: SIGKILL to one task's program (not the coordinator's): charged `killed` to that task;
- sigstop: SIGSTOP to one task's program: charged `stalled` to that task;
- slurmd-killed: one node's slurmd killed (its tasks go on, the controller hears nothing more from
  it and marks it DOWN after --slurmd-timeout): charged `host-lost` to its task and node, which a
  spare node takes.

The programs' processes are found here by their environment (the run id, MGPU_ATTEMPT and
RANK): run.json's pid of a task under Slurm is the step's srun."""

from __future__ import annotations

import os
import shlex
import socket
import sys

import psutil

import soak
from slurm_helpers import Node, start_slurm
from netns_hosts import Netns

FAULTS = ("kill9", "sigstop", "slurmd-killed")
# How long the controller waits on a node's answer: a ping of a node whose slurmd is gone fails
# only then, so a node is marked DOWN about --slurmd-timeout plus two of these after the kill.
MESSAGE_TIMEOUT = 3


def program_pid(run_id: str, attempt: int, rank: int) -> int | None:
    """The soak program's process of the task of `rank` in `attempt` of the run."""
    for proc in psutil.process_iter(["cmdline", "environ"]):
        env, cmdline = proc.info.get("environ") or {}, proc.info.get("cmdline") or []
        if (str(soak.PROGRAM) in cmdline and env.get("MGPU_RUN_ID") == run_id
                and env.get("MGPU_ATTEMPT") == str(attempt) and env.get("RANK") == str(rank)):
            return proc.pid
    return None


class SlurmSoak(soak.Soak):
    def __init__(self, args, lab: Netns, slurm, directory):
        super().__init__(args, lab, directory)
        self.slurm = slurm

    def launch_argv(self, workers: list[str], spares: list[str]) -> list[str]:
        args = self.args
        mgpu = [soak.PYTHON, "-m", "launcher", "launch", "--slurm", "--spare-hosts", ",".join(spares),
                "--max-restarts", str(args.rounds + 2), "--stall-timeout", str(args.stall_timeout),
                "--grace-period", "3", "--log-dir", str(self.dir / "runs"), "--run-id", self.run_id,
                "--", soak.PYTHON, str(soak.PROGRAM), str(self.folder), str(args.steps)]
        script = self.dir / "job.sh"
        script.write_text("#!/bin/sh\nexec " + shlex.join(mgpu) + "\n")
        return ["sbatch", "--wait", "--no-kill", "--no-requeue", f"--nodes={len(workers) + len(spares)}",
                "--ntasks-per-node=1", f"--output={self.dir}/job.out", str(script)]

    def inject(self, fault: soak.Fault, record: dict) -> None:
        attempt = record["attempts"][-1]
        if fault.kind != "slurmd-killed":
            tasks = attempt["tasks"]
            for rank, name in enumerate(sorted(tasks, key=lambda n: int(n.split(":")[1]))):
                tasks[name] = {**tasks[name], "pid": program_pid(self.run_id, attempt["attempt"], rank) or -1}
            super().inject(fault, record)
            return
        others = sorted(name for name in attempt["tasks"] if name != "worker:0")
        fault.task = self.rng.choice(others)
        fault.host = attempt["tasks"][fault.task]["host"]
        fault.attempt = attempt["attempt"]
        fault.injected_at = soak.time.time()
        self.slurm.kill_slurmd(fault.host)


def run(args, directory) -> dict:
    """The soak over Slurm nodes; every daemon stopped and the namespaces removed at the end."""
    os.chmod(directory, 0o755)
    lab = Netns.create(names=[f"h{i + 1}" for i in range(args.workers + args.spares)])
    slurm = None
    try:
        nodes = tuple(Node(name, address, lab.namespaces[name]) for name, address in lab.hosts.items())
        slurm = start_slurm(directory / "slurm", nodes, controller=f"{socket.gethostname()}({lab.subnet}.1)",
                            slurmd_timeout=args.slurmd_timeout, message_timeout=MESSAGE_TIMEOUT)
        os.environ["SLURM_CONF"] = str(slurm.conf)  # for the soak's sbatch and mgpu's srun and scontrol
        return SlurmSoak(args, lab, slurm, directory).run()
    finally:
        if slurm is not None:
            slurm.stop()
        lab.destroy()


if __name__ == "__main__":
    sys.exit("run it as benchmarks/soak.py --backend slurm")
