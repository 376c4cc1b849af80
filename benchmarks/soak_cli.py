"""The soak's command line (benchmarks/soak.py runs it): its options, and each mode's hosts made
and removed around one Soak: over SSH on a shared disk (here) or on private disks with --sync
(soak_private.py), under Slurm (soak_slurm.py); --detach applies to the modes over SSH, --program
trainer (soak_trainer.py) to the shared disk."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import soak
import soak_faults
from soak import FAULTS, RESULTS, Soak
from soak_lab import make_lab
from soak_plot import plot


def over_ssh(args, directory: pathlib.Path) -> dict:
    lab = make_lab(args.workers + args.spares, directory)
    unmount = None
    if "log-disk-full" in args.faults:
        unmount = soak_faults.mount_small_disk(directory / "runs", args.disk_mib)
    from soak_trainer import TrainerSoak
    try:
        return (TrainerSoak if args.program == "trainer" else Soak)(args, lab, directory).run()
    finally:
        if unmount is not None:
            unmount()
        for sshd in lab.sshds.values():
            sshd.stop()
        lab.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=soak.__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=55)
    parser.add_argument("--rounds", type=int, default=None, help="faults injected (the short schedule: one of each)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--spares", type=int, default=3, help="enough for every host fault of the short schedule")
    parser.add_argument("--steps", type=int, default=1600, help="the lasting faults take about 200 steps each")
    parser.add_argument("--steps-between", type=int, default=40, help="steps after a recovery before the next fault")
    parser.add_argument("--stall-timeout", type=float, default=20.0)
    parser.add_argument("--cut", type=float, default=40.0, help="seconds a cut link stays down")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds a slow link, full disk or starved CPU lasts")
    parser.add_argument("--slow-ms", type=int, default=200, help="delay each way of a slowed link")
    parser.add_argument("--starve-share", type=float, default=0.05, help="of a core, a starved host's quota")
    parser.add_argument("--disk-mib", type=int, default=64, help="the log dir's tmpfs, for log-disk-full")
    parser.add_argument("--faults", type=lambda text: tuple(text.split(",")), default=FAULTS,
                        help=f"the kinds drawn, comma-separated (default: all: {','.join(FAULTS)})")
    parser.add_argument("--timeout", type=float, default=600.0, help="for each wait of the schedule")
    parser.add_argument("--backend", choices=("ssh", "slurm"), default="ssh", help="slurm: soak_slurm.py's nodes")
    parser.add_argument("--slurmd-timeout", type=int, default=10, help="Slurm's, for a node whose slurmd is killed")
    parser.add_argument("--disks", choices=("shared", "private"), default="shared",
                        help="private: each host a tmpfs of its own, the program copied with --sync (soak_private.py)")
    parser.add_argument("--program", choices=("ddp", "trainer"), default="ddp",
                        help="trainer: mgpu's built-in TensorFlow trainer (soak_trainer.py), on a shared disk")
    parser.add_argument("--detach", action="store_true", help="mgpu launch --detach: the launcher's faults hit its supervisor")
    parser.add_argument("--name", default="soak")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--replot", action="store_true", help="only draw the plot of results/NAME.json again")
    args = parser.parse_args(argv)
    import soak_slurm  # it imports this module
    kinds = soak_slurm.FAULTS if args.backend == "slurm" else FAULTS
    args.faults = kinds if args.backend == "slurm" and args.faults == FAULTS else args.faults
    if set(args.faults) - set(kinds):
        parser.error(f"unknown faults for {args.backend}: {', '.join(sorted(set(args.faults) - set(kinds)))}")
    args.rounds = args.rounds or len(args.faults)
    if args.replot:
        plot(json.loads((RESULTS / f"{args.name}.json").read_text()))
        return 0
    if os.geteuid() != 0:
        print("soak: needs root (network namespaces)", file=sys.stderr)
        return 2
    directory = pathlib.Path(tempfile.mkdtemp(prefix="mgpu-soak-"))
    import soak_private
    if args.backend == "slurm":
        result = soak_slurm.run(args, directory)
    else:
        result = soak_private.run(args, directory) if args.disks == "private" else over_ssh(args, directory)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    if not args.no_plot:
        plot(result)
    print(json.dumps({k: v for k, v in result.items() if k != "faults"}))
    for fault in result["faults"]:
        charged = fault["charged"] or {}
        print(f"{fault['kind']} of {fault['task']} on {fault['host']}: charged {charged.get('cause')} "
              f"({charged.get('task')} on {charged.get('host')}), right: {fault['right']}, "
              f"detected in {fault['detected_s']} s, first new step after {fault['first_step_s']} s")
    subprocess.run(["rm", "-rf", str(directory)], check=False)
    return 0 if result["charged_right"] == len(result["faults"]) and result["equal_weights"] else 1
