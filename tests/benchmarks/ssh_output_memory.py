"""The launcher's peak memory and throughput with N SSH tasks flooding their output.

Starts one sshd on 127.0.0.1 (as tests/backends/ssh does), runs `mgpu launch` with N workers on it,
each writing MB megabytes of 100-byte lines as fast as it can, samples the launcher's RSS every 20
ms, and checks every log byte for byte. Not a test (nothing here is collected): a measurement.

    PYTHONPATH=. python tests/benchmarks/ssh_output_memory.py 32 8
    PYTHONPATH=. python tests/benchmarks/ssh_output_memory.py 128 2
"""

from __future__ import annotations

import getpass
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "backends" / "ssh"))

from ssh_helpers import keygen, start_sshd  # noqa: E402

from launcher.host.ports import pick_free_ports  # noqa: E402


def line(i: int) -> bytes:
    return b"%08d " % i + b"x" * 90 + b"\n"


def main(tasks: int, megabytes: int) -> None:
    lines = megabytes * 10_000
    program = (f"import sys\nw = sys.stdout.buffer.write\n"
               f"for i in range({lines}): w(b'%08d ' % i + b'x' * 90 + b'\\n')\n")
    run_id = "ssh-output-memory-" + os.urandom(4).hex()
    lab = pathlib.Path(tempfile.mkdtemp(prefix="mgpu-ssh-memory-"))
    key, authorized = lab / "id", lab / "authorized_keys"
    authorized.write_text(keygen(key) + "\n")
    sshd = start_sshd(lab, "a", authorized, extra="MaxSessions 300\nMaxStartups 300\n")
    try:
        (lab / "known_hosts").write_text(sshd.known_hosts_line())
        (lab / "ssh_config").write_text(f"Host sshd-a\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                                        f"  User {getpass.getuser()}\n  IdentityFile {key}\n")
        workers = ",".join(f"sshd-a:{port}" for port in pick_free_ports(tasks))
        env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(lab)}
        env.pop("SSH_AUTH_SOCK", None)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", "launch", "--workers", workers, "--ssh-config", str(lab / "ssh_config"),
             "--known-hosts", str(lab / "known_hosts"), "--no-check", "--log-dir", str(lab / "runs"), "--run-id", run_id,
             "--", sys.executable, "-c", program],
            env=env, cwd=lab, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        launcher, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                peak = max(peak, launcher.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.02)
        wall = time.monotonic() - started
        errors = proc.stderr.read().decode(errors="replace")
        expected = b"".join(line(i) for i in range(lines))
        differ = []
        for i in range(tasks):
            log = (lab / "runs" / run_id / f"worker-{i}.log").read_bytes()
            if log != expected:  # cut short, or with a login shell's lines in it
                foreign = [x for x in log.split(b"\n") if x and not (x[:8].isdigit() and x[8:] == b" " + b"x" * 90)]
                differ.append(f"worker-{i}: {len(log)} of {len(expected)} bytes"
                              + (f", lines not the task's: {foreign[:2]!r}" if foreign else ""))
        print(f"tasks={tasks} MB/task={len(expected) / 1e6:g} exit={proc.returncode} peak_rss={peak / 2**20:.0f} MiB "
              f"wall={wall:.1f} s throughput={tasks * len(expected) / 1e6 / wall:.1f} MB/s "
              f"logs_differing={differ or 'none'}")
        if proc.returncode:
            print(errors[-2000:])
    finally:
        sshd.stop()
        shutil.rmtree(lab, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
