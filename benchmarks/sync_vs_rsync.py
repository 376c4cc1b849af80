"""`mgpu launch --sync` beside `rsync -a` over OpenSSH: a first copy and a copy with nothing
changed, of a folder of 2,000 files (50 MB) to two hosts that share no folder (network
namespaces, each sshd with a tmpfs of its own: the test lab of tests/backends/ssh).

Run as root, with rsync installed: python benchmarks/sync_vs_rsync.py [--files 2000] [--mb 50] [--repeat 3]
Prints one line per measurement (seconds, the median of --repeat runs).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "backends" / "ssh"), str(REPO / "tests")]

from netns_hosts import Netns  # noqa: E402
from ssh_helpers import keygen, start_sshd  # noqa: E402


def make_folder(root: pathlib.Path, files: int, total_mb: int) -> pathlib.Path:
    folder = root / "project"
    size = total_mb * 1_000_000 // files
    for i in range(files):
        path = folder / f"pkg{i % 40:02d}" / f"file{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return folder


def timed(command: list[str], env: dict | None = None) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return elapsed, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    private = f"/tmp/mgpu-bench-private-{os.getpid()}"
    os.makedirs(private)
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        key = directory / "id_client"
        authorized = directory / "authorized_keys"
        authorized.write_text(keygen(key) + "\n")
        folder = make_folder(directory, args.files, args.mb)
        lab = Netns.create()
        servers = []
        try:
            for name, address in lab.hosts.items():
                servers.append(start_sshd(directory, name, authorized, address=address, port=22,
                                          netns=lab.namespaces[name], private_dir=private,
                                          account_startup_files=True))
            known = directory / "known_hosts"
            known.write_text("".join(s.known_hosts_line() for s in servers))
            config = directory / "ssh_config"
            config.write_text("".join(f"Host {n}\n  HostName {a}\n  IdentityFile {key}\n  User root\n"
                                      f"  UserKnownHostsFile {known}\n" for n, a in lab.hosts.items()))
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            env.pop("SSH_AUTH_SOCK", None)
            results: dict[str, list[float]] = {}

            def mgpu(workdir: str) -> tuple[float, float]:
                wall, err = timed([sys.executable, "-m", "launcher", "launch", "--workers", "h1:2222,h2:2222",
                                   "--ssh-config", str(config), "--known-hosts", str(known), "--no-check",
                                   "--log-dir", str(directory / "runs"), "--sync", str(folder), "--workdir", workdir,
                                   "--", "true"], env)
                step = float(re.search(r"to 2 host\(s\) in ([0-9.]+) s", err).group(1))
                return wall, step

            def rsync(target: str) -> float:
                started = time.monotonic()
                procs = [subprocess.Popen(["rsync", "-a", "-e", f"ssh -F {config}", f"{folder}/", f"{host}:{target}/"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                         for host in lab.hosts]
                for proc in procs:
                    if proc.wait(600) != 0:
                        raise RuntimeError(f"rsync failed: {proc.stderr.read()}")
                return time.monotonic() - started

            for run in range(args.repeat):
                first_wall, first_step = mgpu(f"{private}/mgpu-{run}")
                again_wall, again_step = mgpu(f"{private}/mgpu-{run}")
                for name, value in (("mgpu first: sync step", first_step), ("mgpu first: whole launch", first_wall),
                                    ("mgpu no change: sync step", again_step),
                                    ("mgpu no change: whole launch", again_wall),
                                    ("rsync -a first", rsync(f"{private}/rsync-{run}")),
                                    ("rsync -a no change", rsync(f"{private}/rsync-{run}"))):
                    results.setdefault(name, []).append(value)
            total = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            print(f"{args.files} files, {total / 1e6:.1f} MB, to 2 hosts; median of {args.repeat}:")
            for name, values in results.items():
                print(f"  {name:32s} {statistics.median(values):6.2f} s   ({', '.join(f'{v:.2f}' for v in values)})")
        finally:
            for server in servers:
                server.stop()
            lab.destroy()
            os.rmdir(private)


if __name__ == "__main__":
    main()
