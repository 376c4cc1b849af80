#!/usr/bin/env python3
"""Soak under mixed faults: one long run over hosts with sshd, faults injected on a seeded schedule,
and for each fault what mgpu said and how long it took.

Makes WORKERS + SPARES hosts as network namespaces joined by a bridge, each with its own sshd on
port 22 (tests/backends/ssh/ssh_helpers.py, as benchmarks/startup.py does), the hosts sharing this
machine's disk, and runs `mgpu launch` over SSH of a PyTorch DDP program (gloo; soak_program.py:
a checkpoint every 20 steps, resumed after a restart) on the first WORKERS hosts, the others
spares. While it runs, each fault of the schedule (drawn from --seed: the faults' order, the task
or host each hits, and when) is injected once the run has made --steps-between steps since the
last one recovered:

- kill9: SIGKILL to one task's program (not the coordinator's): charged `killed` to that task;
- sigstop: SIGSTOP to one task's program: charged `stalled` to that task (the one the others wait for);
- host-dead: one host's link down and every process in its namespace killed: `host-lost` to it;
- link-cut: one host's link down for --cut seconds, then up: `host-lost` or `network` to it;
- coordinator-lost: the coordinator's (worker:0's) host's link down for --cut seconds: the same;
- slow-link: one host's link slowed by --slow-ms each way (tc netem) for --hold seconds: the run
  goes on, no attempt ends;
- launcher-sighup: SIGHUP to `mgpu launch` (its terminal hung up): the run goes on, its console
  in the run's console.log;
- log-disk-full: the log dir (a tmpfs of --disk-mib MiB) filled for --hold seconds: the run goes on;
- cpu-starved: every process of one host held to --starve-share of a core (a CPU cgroup's quota)
  for --hold seconds: the run goes on (the task may be named as the slowest, --slow-window 10);
- launcher-sigterm, always last: SIGTERM to `mgpu launch`: every task stopped, the run recorded
  `interrupted`, exit code 143, nothing left; then the same launch under a new run id resumes
  from the checkpoint and finishes (first new step: from the SIGTERM to its first step).

For each fault: detection (from the injection to the end of the attempt it hit), whether the cause,
task and host charged are the right ones (run.json's attempt), and the time to the first step of
the next attempt; for the run, its goodput (run.json's costs), that every rank ended with equal
weights, and that no process of the run is left on any host. Writes benchmarks/results/soak.json
(--name) and docs/soak.png. Removes the namespaces and stops every sshd at the end. Needs root,
iproute2, OpenSSH's sshd, and torch in the interpreter that runs it.

With --detach the launch is `mgpu launch --detach` (soak_launcher.py): SIGHUP and SIGTERM hit its
supervisor (run.json's supervisor_pid); SIGTERM is right when run.json records `interrupted`, exit
code 143. --backend slurm: Slurm nodes, and the faults that apply there (soak_slurm.py). --disks
private: each host its own disk, the program copied by --sync, to a spare too (soak_private.py).
--program trainer: mgpu's built-in trainer in place of the DDP program (soak_trainer.py). The
command line is soak_cli.py's. `--faults` runs a subset.

    sudo .venv/bin/python benchmarks/soak.py                     # the short schedule: 10 faults, ~12 min
    sudo .venv/bin/python benchmarks/soak.py --rounds 30 --steps 40000 --name soak-long   # ~2 hours
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import random
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "backends" / "ssh"),
                str(REPO / "tests" / "backends" / "slurm")]

from netns_hosts import Netns, ip  # noqa: E402
from ssh_helpers import run_processes  # noqa: E402

import soak_faults  # noqa: E402
from soak_launcher import Launcher  # noqa: E402

PYTHON = sys.executable  # the hosts share this machine's filesystem, so its interpreter
PROGRAM = HERE / "soak_program.py"
PORT = 29500
# Faults that end the attempt they hit, and those that last a while, after which the run goes on.
ENDING = ("kill9", "sigstop", "host-dead", "link-cut", "coordinator-lost")
GOES_ON = ("slow-link", "launcher-sighup", "log-disk-full", "cpu-starved")
LAST = ("launcher-sigterm",)  # ends the run: scheduled last, then the same launch resumes it
FAULTS = ENDING + GOES_ON + LAST
HOST_CAUSES = ("host-lost", "network")


@dataclasses.dataclass
class Fault:
    kind: str
    at_step: int  # injected once the run's progress reached it
    task: str | None = None  # the task it hits (a task's fault) or whose host it hits
    host: str | None = None
    injected_at: float | None = None  # seconds since the epoch
    attempt: int | None = None  # the attempt it hit
    detected_s: float | None = None  # to the end of that attempt
    first_step_s: float | None = None  # to the next attempt's first step
    charged: dict | None = None  # cause, task, host of that attempt in run.json
    right: bool | None = None

    def row(self) -> dict:
        return dataclasses.asdict(self)


def schedule(seed: int, rounds: int, total: int, between: int, faults=FAULTS) -> list[Fault]:
    """The faults in a seeded order (every kind once per len(faults) rounds), each after `between`
    steps and a seeded number more."""
    rng = random.Random(seed)
    kinds: list[str] = []
    while len(kinds) < rounds:
        batch = list(faults)
        rng.shuffle(batch)
        kinds += batch
    return [Fault(kind, 0) for kind in kinds[:rounds]]


def epoch(text: str | None) -> float | None:
    return datetime.datetime.fromisoformat(text).timestamp() if text else None


class Soak:
    def __init__(self, args, lab: Netns, directory: pathlib.Path):
        self.args, self.lab, self.dir = args, lab, directory
        self.rng = random.Random(args.seed)
        self.run_id = f"soak-{args.seed}-{os.getpid()}"
        self.folder = directory / "shared"
        self.folder.mkdir()
        self.run_json = directory / "runs" / self.run_id / "run.json"
        self.first_run: dict | None = None
        self.over, self.went_on_from = 0.0, None  # when the last lasting fault ends; the step then
        self.undo: list[tuple[float, soak_faults.Undo]] = []  # (when, what undoes a lasting fault)
        # A detached run's console is in console.log from its start: a SIGHUP moves nothing there.
        self.console_log = None if args.detach else directory / "runs" / self.run_id / "console.log"

    def record(self) -> dict | None:
        try:
            return json.loads(self.run_json.read_text())
        except (OSError, ValueError):
            return None

    def progress(self) -> tuple[int, int, float] | None:
        try:
            attempt, step, at = (self.folder / "progress").read_text().split()
            return int(attempt), int(step), float(at)
        except (OSError, ValueError):
            return None

    def tick(self, everything: bool = False) -> None:
        """Undo the faults whose time is over (with `everything`, all of them)."""
        now = time.monotonic()
        for when, undo in list(self.undo):
            if everything or now >= when:
                self.undo.remove((when, undo))
                undo()

    def wait(self, predicate, timeout: float, proc: Launcher):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            found = predicate()
            if found or proc.poll() is not None:
                return found
            time.sleep(0.2)
        return None

    def inject(self, fault: Fault, record: dict) -> None:
        attempt = record["attempts"][-1]
        tasks = attempt["tasks"]
        coordinator = "worker:0"
        others = sorted(name for name in tasks if name != coordinator)
        fault.task = coordinator if fault.kind == "coordinator-lost" else self.rng.choice(others)
        fault.host = tasks[fault.task]["host"]
        fault.attempt = attempt["attempt"]
        fault.injected_at = time.time()
        namespace = self.lab.namespaces[fault.host]
        pid = tasks[fault.task]["pid"]
        over = self.over = time.monotonic() + (0 if fault.kind == "launcher-sighup" else self.args.hold)
        self.went_on_from = None
        if fault.kind == "slow-link":
            self.undo.append((over, soak_faults.start_slow_link(namespace, self.args.slow_ms)))
        elif fault.kind in ("launcher-sighup", "launcher-sigterm"):
            fault.task = fault.host = None
            self.launcher.send_signal(1 if fault.kind == "launcher-sighup" else 15)
        elif fault.kind == "log-disk-full":
            fault.task = fault.host = None
            self.undo.append((over, soak_faults.start_full_disk(self.dir / "runs")))
        elif fault.kind == "cpu-starved":
            self.undo.append((over, soak_faults.start_cpu_starved(namespace, self.args.starve_share, self.run_id)))
        elif fault.kind in ("kill9", "sigstop"):
            try:
                os.kill(pid, 9 if fault.kind == "kill9" else 19)
            except ProcessLookupError:  # the task ended first (a run that finished): judged as it was charged
                pass
        elif fault.kind == "host-dead":
            ip("-n", namespace, "link", "set", "eth0", "down")
            for found in ip("netns", "pids", namespace).stdout.split():
                try:
                    os.kill(int(found), 9)
                except ProcessLookupError:
                    pass
        else:  # link-cut, coordinator-lost
            ip("-n", namespace, "link", "set", "eth0", "down")
            self.undo.append((time.monotonic() + self.args.cut,
                              lambda: ip("-n", namespace, "link", "set", "eth0", "up")))

    def judge(self, fault: Fault, record: dict) -> None:
        attempts = {a["attempt"]: a for a in record["attempts"]}
        hit = attempts.get(fault.attempt)
        if hit is None:
            return
        if fault.kind in GOES_ON:
            soak_faults.judge_went_on(fault, hit, self.console_log)
            return
        ended = epoch(hit.get("ended_at"))
        fault.detected_s = round(ended - fault.injected_at, 1) if ended else None
        fault.charged = {"cause": hit.get("cause"), "task": hit.get("task"), "host": hit.get("host")}
        if fault.kind == "kill9":
            fault.right = fault.charged == {"cause": "killed", "task": fault.task, "host": fault.host}
        elif fault.kind == "sigstop":
            fault.right = fault.charged == {"cause": "stalled", "task": fault.task, "host": fault.host}
        else:
            fault.right = fault.charged["cause"] in HOST_CAUSES and fault.charged["host"] == fault.host

    def went_on(self, fault: Fault) -> bool:
        """A lasting fault is over and the run made steps_between / 2 steps since, or a new attempt began."""
        now = self.progress() or (fault.attempt, 0, 0)
        if now[0] > fault.attempt:
            return True
        if any(True for _ in self.undo) or time.monotonic() < self.over:
            return False
        self.went_on_from = self.went_on_from if self.went_on_from is not None else now[1]
        return now[1] >= self.went_on_from + self.args.steps_between // 2

    def stop_and_resume(self, fault: Fault, argv: list[str], env: dict, console) -> Launcher:
        """After SIGTERM the launcher must stop every task and exit 143, the run recorded `interrupted`,
        nothing of it left on any host; then the same launch under a new run id resumes from the
        checkpoint. The new launcher."""
        code = self.launcher.wait(self.args.timeout)
        fault.detected_s = round(time.time() - fault.injected_at, 1)
        record, left = self.record() or {}, run_processes(self.run_id)
        fault.charged = {"cause": record.get("status"), "task": None, "host": None}
        fault.right = code == 143 and record.get("status") == "interrupted" and not left
        self.first_run = {"run_id": self.run_id, "exit_code": code, "status": record.get("status"),
                          "goodput": record.get("costs", {}).get("goodput"), "processes_left": len(left)}
        self.run_id = f"{self.run_id}-resumed"
        self.run_json = self.dir / "runs" / self.run_id / "run.json"
        self.console_log = None if self.args.detach else self.run_json.parent / "console.log"
        argv = [self.run_id if previous == "--run-id" else arg for previous, arg in zip([None, *argv], argv)]
        stopped_at = time.time()
        proc = self.launcher = Launcher(argv, env, self.dir, console, self.run_json, self.args.detach,
                                        self.args.timeout)
        now = self.wait(lambda: (p := self.progress()) and p[2] > stopped_at and p, self.args.timeout, proc)
        if now:
            fault.first_step_s = round(now[2] - fault.injected_at, 1)
        return proc

    def launch_argv(self, workers: list[str], spares: list[str]) -> list[str]:
        args = self.args
        return [PYTHON, "-m", "launcher", "launch", "--workers", ",".join(f"{h}:{PORT}" for h in workers),
                "--spare-hosts", ",".join(spares), "--max-restarts", str(args.rounds + 2),
                "--stall-timeout", str(args.stall_timeout), "--grace-period", "3", "--connect-timeout", "5",
                "--slow-window", "10",
                "--ssh-config", str(self.dir / "ssh_config"), "--known-hosts", str(self.dir / "known_hosts"),
                "--log-dir", str(self.dir / "runs"), "--run-id", self.run_id, "--workdir", str(self.dir),
                "--", PYTHON, str(PROGRAM), str(self.folder), str(args.steps)]

    def run(self) -> dict:
        args = self.args
        hosts = list(self.lab.hosts)
        workers, spares = hosts[:args.workers], hosts[args.workers:]
        faults = schedule(args.seed, args.rounds, args.steps, args.steps_between, args.faults)
        faults = [f for f in faults if f.kind not in LAST] + [f for f in faults if f.kind in LAST][:1]
        env = {**os.environ, "HOME": str(self.dir / "home"), "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        argv = self.launch_argv(workers, spares)
        started = time.time()
        with open(self.dir / "console.log", "w") as console:
            proc = self.launcher = Launcher(argv, env, self.dir, console, self.run_json, args.detach, args.timeout)
            try:
                recovered_step = 0
                for fault in faults:
                    want = recovered_step + args.steps_between + self.rng.randrange(args.steps_between)
                    if want >= args.steps - args.steps_between:
                        break
                    fault.at_step = want
                    if not self.wait(lambda: (self.progress() or (0, 0, 0))[1] >= want, args.timeout, proc):
                        break
                    record = self.record()
                    if record is None:
                        break
                    self.inject(fault, record)
                    print(f"soak: {fault.kind} of {fault.task} on {fault.host} at step {want}", flush=True)
                    if fault.kind in LAST:
                        proc = self.stop_and_resume(fault, argv, env, console)
                    elif fault.kind in GOES_ON:
                        self.wait(lambda: self.went_on(fault), args.timeout, proc)
                        recovered_step = (self.progress() or (0, recovered_step, 0))[1]
                    else:
                        self.wait(lambda: (self.progress() or (-1, 0, 0))[0] > fault.attempt, args.timeout, proc)
                    now = self.progress()
                    if now is not None and now[0] > fault.attempt and fault.kind not in LAST:
                        fault.first_step_s = round(now[2] - fault.injected_at, 1)
                        recovered_step = now[1]
                    record = self.record()
                    if record is not None and fault.kind not in LAST:
                        self.judge(fault, record)
                    print(f"soak:   charged {fault.charged}, right: {fault.right}, detected in {fault.detected_s} s, "
                          f"first new step after {fault.first_step_s} s", flush=True)
                code = proc.wait(args.timeout)
            finally:
                if proc.poll() is None:
                    proc.send_signal(2)
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                self.tick(everything=True)
        record = self.record() or {}
        finals = {p.name: p.read_text() for p in self.folder.glob("final-*")}
        left = [p.pid for run_id in {self.run_id, self.run_id.removesuffix("-resumed")} for p in run_processes(run_id)]
        costs = record.get("costs", {})
        injected = [f for f in faults if f.injected_at is not None]
        return {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
            "seed": args.seed, "backend": args.backend, "detach": args.detach, "workers": args.workers, "spares": len(spares), "steps": args.steps,
            "stall_timeout_s": args.stall_timeout, "cut_s": args.cut, "hold_s": args.hold,
            "exit_code": code, "status": record.get("status"), "wall_s": round(time.time() - started, 1),
            "restarts": costs.get("restarts"), "time_lost_s": costs.get("time_lost_s"), "goodput": costs.get("goodput"),
            "equal_weights": len(finals) == args.workers and len(set(finals.values())) == 1,
            "processes_left": len(left),
            "charged_right": sum(bool(f.right) for f in injected), "faults": [f.row() for f in injected],
            "first_run": self.first_run,  # the run SIGTERM stopped, where it was injected
        }


if __name__ == "__main__":
    import soak_cli  # its modes import this module

    sys.exit(soak_cli.main())
