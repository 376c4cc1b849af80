"""The soak on private disks (benchmarks/soak.py --disks private): each host sees a tmpfs of its own
at one path (its sshd in a mount namespace of its own, as the suite's --sync tests make hosts), and
the launch copies the program there with `--sync` before anything starts, and to a spare before it
takes a lost host's tasks. The program runs in that copy and keeps its checkpoint on the host's
own disk, every rank its own: a restart resumes from the newest checkpoint any rank holds, sent to
the others from one that holds it (a spare has none of its own). What the soak reads of the run,
the program's progress and each rank's final weights, it writes to a folder on this machine's disk
outside the private path, as a harness's channel and no part of the training.

At the end: on which hosts still up the program's copy lies (`synced`), besides soak.py's figures."""

from __future__ import annotations

import os
import pathlib
import shutil

import soak
from soak_lab import make_lab

WORKDIR = "work"  # under the private path: the --sync copy, the tasks' folder and their checkpoints


class PrivateSoak(soak.Soak):
    def __init__(self, args, lab, directory: pathlib.Path, private: pathlib.Path):
        super().__init__(args, lab, directory)
        self.private = private
        self.source = directory / "source"  # the folder --sync copies: the program alone
        self.source.mkdir()
        shutil.copy2(soak.PROGRAM, self.source / soak.PROGRAM.name)

    def launch_argv(self, workers: list[str], spares: list[str]) -> list[str]:
        argv = super().launch_argv(workers, spares)
        argv[argv.index("--workdir") + 1] = str(self.private / WORKDIR)
        program = argv.index(str(soak.PROGRAM))
        argv[program] = soak.PROGRAM.name  # the copy in the workdir
        return argv[:program - 2] + ["--sync", str(self.source)] + argv[program - 2:] + ["."]

    def run(self) -> dict:
        result = super().run()
        copy = f"{self.private}/{WORKDIR}/{soak.PROGRAM.name}"
        result["disks"] = "private"
        result["synced"] = sorted(name for name, sshd in self.lab.sshds.items()
                                  if sshd.proc.poll() is None and sshd.private_path(copy).is_file())
        return result


def run(args, directory: pathlib.Path) -> dict:
    """The soak over hosts with private disks; every sshd stopped (and with it its tmpfs) at the end."""
    private = pathlib.Path(f"/tmp/mgpu-soak-private-{os.getpid()}")
    private.mkdir(mode=0o755)
    lab = make_lab(args.workers + args.spares, directory, private_dir=str(private))
    try:
        return PrivateSoak(args, lab, directory, private).run()
    finally:
        for sshd in lab.sshds.values():
            sshd.stop()
        lab.destroy()
        private.rmdir()
