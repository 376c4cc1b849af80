"""Tasks over SSH for the tests: SshBackend's plans and streams, mgpu's SSH arguments, hosts with a ForceCommand."""

from __future__ import annotations

import contextlib
import pathlib
import threading
from typing import Iterator

import psutil

from launcher.config.spec import SshSettings
from launcher.host import proctree
from launcher.host.ports import pick_free_ports
from launcher.plan.planner import TaskPlan
from launching import wait_for
from ssh_helpers import PYTHON, start_sshd, unique_run_id


def plan(host: str, argv, env=None, ssh: SshSettings = SshSettings(), run_id: str | None = None, workdir=None,
         index: int = 0) -> TaskPlan:
    run_id = run_id or unique_run_id("ssh-test")
    full_env = {"TF_CONFIG": "{}", "MGPU_RUN_ID": run_id, "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": str(index)}
    full_env.update(env or {})
    return TaskPlan("worker", index, host, 2222, False, ssh, tuple(argv), full_env, workdir, False)


def drain(proc) -> tuple[bytes, bytes]:
    """Read both streams concurrently, as the supervisor does."""
    chunks = {"out": [], "err": []}

    def pump(stream, key):
        while True:
            line = stream.readline()
            if not line:
                return
            chunks[key].append(line)

    threads = [threading.Thread(target=pump, args=(proc.stdout, "out")),
               threading.Thread(target=pump, args=(proc.stderr, "err"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "stream did not end"
    return b"".join(chunks["out"]), b"".join(chunks["err"])


def wait_exit(proc, timeout: float = 120) -> int:
    wait_for(lambda: proc.poll() is not None, timeout, "the task's end", interval=0.02)
    return proc.poll()


def kept_shells(folder) -> list[psutil.Process]:
    """The shells of sessions that host checks kept to start a task (their script names `folder`,
    the task's workdir)."""
    from launcher.backends.ssh.handover import HANDOVER

    found = []
    for proc in proctree.every_process():
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if HANDOVER in cmdline and str(folder) in cmdline:
            found.append(proc)
    return found


# Worker 0 and worker 1 behave as the test asks through $MODE_<index>.
TASK_PROGRAM = r"""
import json, os, subprocess, sys, time
index = os.environ["MGPU_TASK_INDEX"]
mode = os.environ.get("MODE_" + index, "ok")
print("task", index, json.loads(os.environ["TF_CONFIG"])["task"]["index"], os.getpgid(0), flush=True)
if mode == "fail":
    sys.exit(1)
if mode == "hang":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("hanging", flush=True)
    time.sleep(300)
"""


def ssh_args(ssh_lab) -> list[str]:
    return ["--ssh-config", str(ssh_lab.ssh_config), "--known-hosts", str(ssh_lab.known_hosts),
            "--connect-timeout", "5"]


def launch_args(ssh_lab, run_id: str, *extra: str) -> list[str]:
    port_a, port_b = pick_free_ports(2)
    return ["launch", "--workers", f"sshd-a:{port_a},sshd-b:{port_b}", *ssh_args(ssh_lab), "--run-id", run_id,
            "--grace-period", "3", *extra, "--", PYTHON, "-c", TASK_PROGRAM]


@contextlib.contextmanager
def forced_host(ssh_lab, tmp_path, name: str, force_command: str) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    """One more loopback sshd, host `name`, whose sessions run `force_command` (sshd's ForceCommand,
    which may run the session's command from $SSH_ORIGINAL_COMMAND): (known_hosts, ssh config)
    that name it beside sshd-a and sshd-b."""
    server = start_sshd(tmp_path, name, ssh_lab.authorized_keys, extra=f"ForceCommand {force_command}\n")
    try:
        known = tmp_path / "known_hosts"
        known.write_text(ssh_lab.known_hosts.read_text() + server.known_hosts_line())
        config = tmp_path / "ssh_config"
        config.write_text(ssh_lab.ssh_config.read_text() + f"Host {name}\n  HostName {server.address}\n"
                          f"  Port {server.port}\n  User {ssh_lab.user}\n  IdentityFile {ssh_lab.client_key}\n")
        yield known, config
    finally:
        server.stop()


# What a task sees of its session: every environment variable, where it starts, the signals it
# ignores and blocks (/proc's masks, read by sh: Python ignores two signals of its own at start), and
# whether it leads its session's process group.
SESSION_PROGRAM = r"""
import json, os, sys
print("SESSION " + json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "signals": sys.argv[1],
      "leader": os.getsid(0) == os.getpgid(0)}), flush=True)
"""
SESSION_COMMAND = ["/bin/sh", "-c", 'exec "$0" -c "$1" "$(grep -E "^Sig(Ign|Blk)" /proc/$$/status)"', PYTHON,
                   SESSION_PROGRAM]
# Per launch: the run's tags, its ports, and the SSH connection's own (its source port); the
# interface the checks found (none without them); the session's command, which ForceCommand shows.
_PER_LAUNCH = {"TF_CONFIG", "MGPU_LAUNCH_ID", "MGPU_RUN_ID", "TORCHELASTIC_RUN_ID", "SSH_CLIENT", "SSH_CONNECTION",
               "MASTER_PORT", "MASTER_ADDR", "JAX_COORDINATOR_ADDRESS", "KERAS_DISTRIBUTION_JOB_ADDRESSES",
               "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "SSH_ORIGINAL_COMMAND",
               "TORCH_WORKER_SERVER_SOCKET"}  # named after the run (the flight recorder's socket)
