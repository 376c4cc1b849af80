"""A real Slurm for the tests: munged, slurmctld and slurmd with their own config, state, socket
and ports in a temporary directory, stopped afterwards; and what the tests of `mgpu launch --slurm`
share: its command line, an allocation to run it in, the run's record, a task program.

Without Debian's slurm-wlm and munge these tests skip; with MGPU_REQUIRE_SSHD=1 (CI) they fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from launcher.host import proctree
from launching import free_port

REQUIRE = os.environ.get("MGPU_REQUIRE_SSHD") == "1"
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("srun", "sbatch", "scancel", "squeue", "sinfo")


def require_slurm() -> None:
    missing = [d for d in DAEMONS if not os.access(d, os.X_OK)] + [c for c in CLIENTS if shutil.which(c) is None]
    reason = None
    if missing:
        reason = f"needs {', '.join(missing)} (apt-get install slurm-wlm munge)"
    elif os.geteuid() != 0:
        reason = "needs root to run slurmd"
    if reason:
        if REQUIRE:
            pytest.fail(reason + " and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip(reason)


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    address: str
    netns: str | None = None  # the network namespace its slurmd runs in


@dataclasses.dataclass
class SlurmLab:
    directory: pathlib.Path
    nodes: tuple[Node, ...]
    conf: pathlib.Path
    procs: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment in which Slurm's commands talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=kwargs.pop("env", self.env), capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def wait_idle(self, timeout: float = 30) -> None:
        """Until every node is idle (slurmd registered, nothing running)."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.run("sinfo", "-h", "-N", "-o", "%N %t")
            states = dict(line.split() for line in shown.stdout.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(state == "idle" for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not idle after {timeout} s: {states} {shown.stderr} "
                                     f"{self.log_tail()}")
            time.sleep(0.3)

    def wait_no_jobs(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.run("squeue", "-h").stdout.strip():
            if time.monotonic() > deadline:
                raise AssertionError("jobs still queued: " + self.run("squeue").stdout)
            time.sleep(0.3)

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL to the node's slurmd alone: its steps' processes go on, the controller hears nothing more from it."""
        index = [n.name for n in self.nodes].index(node)
        self.procs[2 + index].kill()  # after munged and slurmctld, one slurmd per node in order

    def log_tail(self, lines: int = 15) -> str:
        text = []
        for log in sorted(self.directory.glob("*.log")):
            text.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(text)

    def stepds(self) -> list[psutil.Process]:
        """This cluster's slurmstepds, and no other's: other clusters run on this machine at the
        same time (other tests, other checkouts), and stopping theirs ends their jobs."""
        found = []
        for p in proctree.every_process():
            try:
                if p.name() == "slurmstepd" and _conf_of(p.pid) == str(self.conf):
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def stop(self) -> None:
        """Stop the daemons, and every process still running under a slurmstepd of this cluster."""
        self.run("scancel", "--full", "--user", "root", timeout=30)
        stepds = self.stepds()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:  # a slurmd still waiting on a job it was told to end keeps going for seconds
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        leftovers = []
        for stepd in stepds:
            try:
                leftovers += [stepd, *stepd.children(recursive=True)]
            except psutil.Error:
                pass
        for proc in leftovers:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=5)


def _conf_of(pid: int) -> str | None:
    """The SLURM_CONF in a process's environment, read from the raw block: slurmstepd writes its
    title ("slurmstepd: [1.batch]") over the start of that block, so psutil's parse of it, which
    stops at the first empty entry, is empty for every slurmstepd. None when it has none or is gone."""
    try:
        block = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in block.split(b"\0"):
        if entry.startswith(b"SLURM_CONF="):
            return entry[len(b"SLURM_CONF="):].decode(errors="replace")
    return None


def _in_netns(netns: str | None, argv: list[str]) -> list[str]:
    """argv in the network namespace, with its /etc/netns/<ns>/hosts as /etc/hosts.

    Not `ip netns exec`: that mounts a fresh /sys without the cgroup file systems slurmd needs.
    """
    if not netns:
        return argv
    return ["nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--mount", "--propagation", "private",
            "sh", "-c", f'mount --bind /etc/netns/{netns}/hosts /etc/hosts && exec "$@"', "sh", *argv]


def _write_config(directory: pathlib.Path, nodes: tuple[Node, ...], controller: str, munge_socket: pathlib.Path,
                  cpus: int, gpus: int = 0, slurmd_timeout: int = 30, message_timeout: int = 10) -> pathlib.Path:
    conf = directory / "slurm.conf"
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    node_lines = "".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={cpus}{gres} State=UNKNOWN\n" for n in nodes)
    if gpus:
        # GPUs as Slurm knows them: device files it hands out, one per GPU (here copies of
        # /dev/null: nothing opens them). gres.conf sits beside slurm.conf, where slurmd looks.
        for index in range(gpus):
            device = directory / f"gpu{index}"
            if not device.exists():
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (directory / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={directory}/gpu[0-{gpus - 1}]\n")
    conf.write_text(
        "ClusterName=mgpu-test\n"
        + ("GresTypes=gpu\n" if gpus else "") +
        f"SlurmctldHost={controller}\n"
        f"SlurmctldPort={free_port()}\n"
        f"SlurmdPort={free_port()}\n"
        f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={munge_socket}\n"
        f"SlurmUser=root\nSlurmdUser=root\n"
        f"StateSaveLocation={directory}/state\n"
        f"SlurmdSpoolDir={directory}/spool-%n\n"
        f"SlurmctldPidFile={directory}/slurmctld.pid\nSlurmdPidFile={directory}/slurmd-%n.pid\n"
        f"SlurmctldLogFile={directory}/slurmctld.log\nSlurmdLogFile={directory}/slurmd-%n.log\n"
        f"ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
        f"JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        f"SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        f"SlurmdParameters=config_overrides\nReturnToService=2\nKillWait=5\nMinJobAge=2\n"
        f"SlurmctldTimeout=30\nSlurmdTimeout={slurmd_timeout}\nMessageTimeout={message_timeout}\n"
        f"InactiveLimit=0\nWaitTime=0\n"
        + node_lines +
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n"
    )
    return conf


def start_slurm(directory: pathlib.Path, nodes: tuple[Node, ...], controller: str = "localhost",
                cpus: int = 4, gpus: int = 0, slurmd_timeout: int = 30, message_timeout: int = 10) -> SlurmLab:
    """munged on a private socket, slurmctld here, one slurmd per node (in its namespace, if any).
    `slurmd_timeout`: how long a node's slurmd may not answer before the controller marks it DOWN;
    `message_timeout`: how long the controller waits on a node's answer, which is also how long its
    ping of a node whose slurmd is gone takes to fail (so the node is marked DOWN about
    slurmd_timeout plus two message_timeouts after its slurmd stopped)."""
    require_slurm()
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    for folder in ["state", *(f"spool-{node.name}" for node in nodes)]:
        (directory / folder).mkdir(exist_ok=True)
    munge_socket = directory / "munge.socket"
    conf = _write_config(directory, nodes, controller, munge_socket, cpus, gpus, slurmd_timeout, message_timeout)
    lab = SlurmLab(directory, nodes, conf)
    try:
        key = directory / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        lab.procs.append(subprocess.Popen(
            ["/usr/sbin/munged", "-F", "-f", f"--socket={munge_socket}", f"--key-file={key}",
             f"--pid-file={directory}/munged.pid", f"--log-file={directory}/munged.log",
             f"--seed-file={directory}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(lambda: munge_socket.exists(), 10, "munged's socket", lab)
        env = lab.env
        lab.procs.append(subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for node in nodes:
            lab.procs.append(subprocess.Popen(_in_netns(node.netns, ["/usr/sbin/slurmd", "-D", "-N", node.name,
                                                                     "-f", str(conf)]),
                                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        lab.wait_idle()
    except BaseException:
        lab.stop()
        raise
    return lab


def _wait_for(predicate, timeout: float, what: str, lab: SlurmLab) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not there after {timeout} s\n{lab.log_tail()}")
        if any(proc.poll() is not None for proc in lab.procs):
            raise AssertionError(f"a daemon exited while waiting for {what}\n{lab.log_tail()}")
        time.sleep(0.1)


def free_ports_in_a_row(n: int) -> int:
    """The first of `n` consecutive ports that were free a moment ago: `--port P` plans the tasks
    of one node on P, P+1, ..."""
    from launcher.host.ports import pick_free_ports
    from launcher.host.ports_in_use import port_in_use

    for _ in range(200):
        first = pick_free_ports(1)[0]
        if first + n <= 65536 and not any(port_in_use(first + i) for i in range(1, n)):
            return first
    raise AssertionError(f"no {n} consecutive free ports")


# -- `mgpu launch --slurm` in the cluster's allocations ------------------------------------

MGPU = [sys.executable, "-m", "launcher"]
NODE = socket.gethostname()


def run_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def in_allocation(slurm: SlurmLab, tmp_path: pathlib.Path, argv: list[str], tasks: int = 2,
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """`salloc -n TASKS ARGV` with the output of ARGV; fails the test when it runs too long."""
    try:
        return slurm.run("salloc", "--quiet", f"--ntasks={tasks}", "--time=10", *argv, timeout=timeout, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv} did not finish in {timeout} s:\n{exc.stdout}\n{exc.stderr}")


def launch_argv(tmp_path: pathlib.Path, rid: str, *args: str) -> list[str]:
    return [*MGPU, "launch", "--slurm", "--log-dir", str(tmp_path / "runs"), "--run-id", rid, "--grace-period", "5",
            *args]


def run_record(tmp_path: pathlib.Path, rid: str) -> dict:
    return json.loads((tmp_path / "runs" / rid / "run.json").read_text())


# A task program: prints what it was given, then does what its rank is told to in TEST_ORDERS.
PROGRAM = r"""
import json, os, signal, sys, time
rank = int(os.environ["SLURM_PROCID"])
attempt = os.environ["MGPU_ATTEMPT"]
orders = json.loads(os.environ.get("TEST_ORDERS", "{}"))
order = orders.get(f"{rank}@{attempt}", orders.get(str(rank), "exit0"))
def on_term(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
seen = {k: os.environ.get(k) for k in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "MGPU_TASK_TYPE", "MGPU_TASK_INDEX",
                                       "SLURMD_NODENAME", "MGPU_SLURM_PLAN", "EXTRA", "NCCL_SOCKET_IFNAME",
                                       "GLOO_SOCKET_IFNAME")}
print("SEEN " + json.dumps(seen), flush=True)
print(f"to stderr from {rank}", file=sys.stderr, flush=True)
if order == "fail":
    sys.exit(1)
if order == "forever":
    while True:
        time.sleep(0.2)
"""


def program(tmp_path: pathlib.Path) -> list[str]:
    path = tmp_path / "task.py"
    path.write_text(PROGRAM)
    return [sys.executable, str(path)]
