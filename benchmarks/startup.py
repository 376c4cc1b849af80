#!/usr/bin/env python3
"""Start-up time against the number of hosts: `mgpu check` and `mgpu launch` beside OpenSSH.

Makes N hosts as network namespaces joined by a bridge, each with its own sshd on port 22 (the
helpers of tests/backends/ssh/ssh_helpers.py), one task per host (--tasks-per-host), and times,
for the first 2, 4, 8, 16 of them (--hosts):
- the floor: the task's program started on every host at once by OpenSSH (`ssh hI PROGRAM` for
  each host, all in parallel, as `xargs -P N ssh` would), until the last one has ended;
- `mgpu check` (the host check and the reachability test between every pair of tasks);
- `mgpu launch --no-check`, and `mgpu launch` with its checks, until the run has ended;
for a trivial program (`python -c 'print(1)'`) and, at --trainer-hosts host counts, for the
built-in trainer run for one step (which imports TensorFlow on every host: the floor then runs
the trainer by hand with each task's TF_CONFIG). The measures of a round are interleaved, the
rounds repeated (--repeats) and medians kept; with each `mgpu` measure the peak RSS of the
launcher (the largest of it and the processes it waited for, from wait4).

Writes benchmarks/results/startup.json (--name) and docs/startup.png, the time against hosts.
Removes the namespaces and stops every sshd at the end, also on Ctrl-C. Needs root, iproute2
and OpenSSH's sshd and ssh.

    sudo python benchmarks/startup.py                          # 2,4,8,16 hosts; trainer at 2,4
    sudo python benchmarks/startup.py --hosts 2,4,8,16,32 --trainer-hosts none --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import getpass
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterator

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
PLOT = REPO / "docs" / "startup.png"
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "backends" / "ssh")]

from netns_hosts import Netns  # noqa: E402
from ssh_helpers import keygen, start_sshd  # noqa: E402

PYTHON = sys.executable  # the hosts share this machine's filesystem, so its interpreter
TRIVIAL = [PYTHON, "-c", "print(1)"]
# Task 0 fails in the first attempt: the run restarts once. What that costs beside a launch that
# does not restart is the restart's time (every task stopped, started again and ended).
FAILS_ONCE = [PYTHON, "-c", "import os, sys; print(1); sys.exit(3 if os.environ['MGPU_ATTEMPT'] == '0' "
              "and os.environ['MGPU_TASK_INDEX'] == '0' else 0)"]
TRAINER_ARGS = ["--dataset", "synthetic", "--model", "cnn", "--train-steps", "1", "--eval-steps", "1",
                "--threads", "1"]
PORT = 2222
TIMEOUT = 600.0


@dataclasses.dataclass
class Lab:
    dir: pathlib.Path
    netns: Netns
    key: pathlib.Path
    known_hosts: pathlib.Path
    ssh_config: pathlib.Path
    env: dict[str, str]  # for ssh and mgpu: a HOME of the lab's own, no agent, this checkout imported

    def names(self, count: int) -> list[str]:
        return list(self.netns.hosts)[:count]


NEIGHBOUR_LIMITS = ("net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3")


@contextlib.contextmanager
def neighbour_room(count: int) -> Iterator[None]:
    """Room for `count` hosts' ARP entries. Every network namespace of this machine shares one
    neighbour table (1024 entries by default): `count` hosts that all dial each other need count²
    of them, which real hosts, each with its own table, do not share. Without it a host's packets
    to a new neighbour are dropped ("neighbor table overflow") and connections time out."""
    saved = {key: int(pathlib.Path("/proc/sys", *key.split(".")).read_text()) for key in NEIGHBOUR_LIMITS}
    wanted = {NEIGHBOUR_LIMITS[0]: 2 * count * count + 512, NEIGHBOUR_LIMITS[1]: 4 * count * count + 1024}
    try:
        for key, value in wanted.items():
            if value > saved[key]:
                pathlib.Path("/proc/sys", *key.split(".")).write_text(str(value))
        yield
    finally:
        for key, value in saved.items():
            pathlib.Path("/proc/sys", *key.split(".")).write_text(str(value))


@contextlib.contextmanager
def lab(count: int) -> Iterator[Lab]:
    """`count` hosts h1..hN, each in its namespace with an sshd on port 22; all gone on exit."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="mgpu-startup-"))
    key, authorized = directory / "id", directory / "authorized_keys"
    authorized.write_text(keygen(key) + "\n")
    netns = Netns.create(names=[f"h{i + 1}" for i in range(count)])
    try:
        for name, address in netns.hosts.items():
            netns.sshds[name] = start_sshd(directory, name, authorized, address=address, port=22,
                                           netns=netns.namespaces[name], extra="MaxStartups 200\nMaxSessions 64\n",
                                           account_startup_files=True)
        known = directory / "known_hosts"
        known.write_text("".join(s.known_hosts_line() for s in netns.sshds.values()))
        config = directory / "ssh_config"
        config.write_text("".join(f"Host {n}\n  HostName {a}\n  User {getpass.getuser()}\n  IdentityFile {key}\n"
                                  f"  UserKnownHostsFile {known}\n  BatchMode yes\n"
                                  for n, a in netns.hosts.items()))
        home = directory / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        yield Lab(directory, netns, key, known, config, env)
    finally:
        for sshd in netns.sshds.values():
            sshd.stop()
        netns.destroy()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def timed(argv: list[str], env: dict[str, str], cwd: pathlib.Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB of the process and what it waited for) of `argv` run to its end."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            out.seek(0)
            raise RuntimeError(f"{shlex.join(argv[:6])}... exited {proc.returncode}:\n"
                               f"{out.read().decode(errors='replace')[-3000:]}")
    return elapsed, usage.ru_maxrss / 1024


def floor(lab: Lab, hosts: list[str], per_host: int, trainer: bool) -> float:
    """Every task's program started by OpenSSH on its host at once; seconds until the last has ended."""
    commands = []
    addresses = [f"{lab.netns.hosts[h]}:{PORT + i}" for h in hosts for i in range(per_host)]
    for index, address in enumerate(addresses):
        host = hosts[index // per_host]
        if trainer:
            tf_config = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
            program = ["env", f"TF_CONFIG={tf_config}", f"PYTHONPATH={REPO}", "CUDA_VISIBLE_DEVICES=",
                       PYTHON, "-m", "launcher.trainer", *TRAINER_ARGS]
        else:
            program = TRIVIAL
        if index % per_host:
            continue  # one session per host starts all of its processes at once
        if per_host > 1 and not trainer:
            program = ["sh", "-c", " ".join([shlex.join(program) + " &"] * per_host) + " wait"]
        commands.append(["ssh", "-F", str(lab.ssh_config), host, shlex.join(program)])
    started = time.perf_counter()
    procs = [subprocess.Popen(c, env=lab.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for c in commands]
    failed = []
    for proc in procs:
        _, err = proc.communicate(timeout=TIMEOUT)
        if proc.returncode != 0:
            failed.append(err.decode(errors="replace")[-500:])
    elapsed = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"ssh failed on {len(failed)} host(s): {failed[0]}")
    return elapsed


def mgpu(lab: Lab, command: str, hosts: list[str], per_host: int, trainer: bool, check: bool = True,
         checkout: pathlib.Path = REPO, agent: bool = True, restart: bool = False) -> tuple[float, float]:
    """`mgpu COMMAND` of `checkout` (this one, or the baseline's) on `hosts`, to its end."""
    argv = [PYTHON, "-m", "launcher", command, "--hosts", ",".join(f"{h}:{per_host}" for h in hosts),
            "--port", str(PORT), "--ssh-config", str(lab.ssh_config), "--known-hosts", str(lab.known_hosts)]
    if command == "launch":
        argv += ["--log-dir", str(lab.dir / "runs")] + ([] if check else ["--no-check"])
        argv += ([] if agent else ["--no-host-agent"]) + (["--max-restarts", "1"] if restart else [])
    if trainer:
        argv += ["--python", PYTHON]
        if command == "launch":
            argv += ["--env", f"PYTHONPATH={REPO}"]
        argv += ["--", *TRAINER_ARGS]
    else:
        argv += ["--", *(FAILS_ONCE if restart else TRIVIAL)]
    return timed(argv, {**lab.env, "PYTHONPATH": str(checkout)}, lab.dir)


MEASURES = ("floor", "check", "launch_no_check", "launch", "launch_no_agent", "restart", "restart_no_agent")
# With --no-host-agent (a session per task), and a launch that restarts once (with the host agent and
# without it): the trivial program only.
TRIVIAL_ONLY = ("launch_no_agent", "restart", "restart_no_agent")
BASELINE_MEASURES = ("baseline_check", "baseline_launch")  # with --baseline: its checks, and its launch with them


def measure_once(lab: Lab, what: str, hosts: list[str], per_host: int, trainer: bool,
                 baseline: pathlib.Path | None = None) -> tuple[float, float | None]:
    if what == "floor":
        return floor(lab, hosts, per_host, trainer), None
    checkout = REPO
    if what.startswith("baseline_"):
        checkout, what = baseline, what.removeprefix("baseline_")
    if what == "check":
        return mgpu(lab, "check", hosts, per_host, trainer, checkout=checkout)
    if what in TRIVIAL_ONLY:
        return mgpu(lab, "launch", hosts, per_host, trainer, agent=not what.endswith("no_agent"),
                    restart=what.startswith("restart"))
    return mgpu(lab, "launch", hosts, per_host, trainer, check=what == "launch", checkout=checkout)


def run(counts: list[tuple[int, int]], trainer_counts: list[tuple[int, int]], repeats: int,
        baseline: pathlib.Path | None = None, only: tuple[str, ...] = MEASURES
        ) -> tuple[list[dict], list[float] | None]:
    """Every measure's rows, and the range of the machine's 1-minute load while they ran; each count
    is (hosts, tasks per host)."""
    cases = [(n, each, False) for n, each in counts] + [(n, each, True) for n, each in trainer_counts]
    measures = tuple(what for what in MEASURES if what in only) + (BASELINE_MEASURES if baseline else ())
    runs: dict = {(n, each, t, what): [] for n, each, t in cases for what in measures}
    failures: dict = {key: [] for key in runs}
    loads: list[float] = []
    most = max(n for n, _, _ in cases)
    with neighbour_room(most), lab(most) as hosts_lab:
        for what in measures:  # a warm-up: the first logins and imports of a fresh lab are slower
            measure_once(hosts_lab, what, hosts_lab.names(2), cases[0][1], False, baseline)
        for repeat in range(repeats):  # interleaved: drifting load hits every measure alike
            for n, per_host, trainer in cases:
                for what in measures:
                    if trainer and what in TRIVIAL_ONLY:
                        continue
                    label = (f"# repeat {repeat} {n:>3} hosts x {per_host} {'trainer' if trainer else 'trivial'} "
                             f"{what:<16}")
                    try:
                        seconds, rss = measure_once(hosts_lab, what, hosts_lab.names(n), per_host, trainer, baseline)
                    except RuntimeError as e:  # kept as a failed run: how often a check fails is a result too
                        failures[(n, per_host, trainer, what)].append(str(e).strip().splitlines()[-1][:300])
                        print(f"{label} failed: {e}", file=sys.stderr, flush=True)
                        continue
                    runs[(n, per_host, trainer, what)].append((seconds, rss))
                    loads.append(os.getloadavg()[0])
                    print(f"{label} {seconds:6.2f} s" + (f"  {rss:5.0f} MB" if rss else "")
                          + f"  load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    rows = []
    for (n, per_host, trainer, what), found in runs.items():
        seconds = [s for s, _ in found]
        rss = [r for _, r in found if r is not None]
        rows.append({"hosts": n, "tasks_per_host": per_host, "tasks": n * per_host,
                     "program": "trainer" if trainer else "trivial", "measure": what,
                     "median_s": round(statistics.median(seconds), 2) if seconds else None,
                     "runs_s": [round(s, 2) for s in seconds], "failed": failures[(n, per_host, trainer, what)],
                     "peak_rss_mb": round(statistics.median(rss), 1) if rss else None})
    return rows, [round(min(loads), 1), round(max(loads), 1)] if loads else None


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python {platform.python_version()}"


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len({r.get("tasks_per_host", result["tasks_per_host"]) for r in result["rows"]}) > 1:
        return plot_shapes(result, path, plt)

    labels = {"floor": "OpenSSH, every host at once", "check": "mgpu check", "launch_no_check": "mgpu launch --no-check",
              "launch": "mgpu launch (with its checks)", "launch_no_agent": "mgpu launch --no-host-agent"}
    if result.get("baseline"):
        labels["baseline_launch"] = f"mgpu launch (with its checks), {result['baseline']}"
    fig, ax = plt.subplots(figsize=(6, 4))
    for what, style in zip(("floor", "check", "launch_no_check", "launch", "launch_no_agent", "baseline_launch"),
                           ("k:", "s--", "^-.", "o-", "D-", "x:")):
        rows = [r for r in result["rows"] if r["program"] == "trivial" and r["measure"] == what and r["median_s"]]
        ax.plot([r["hosts"] for r in rows], [r["median_s"] for r in rows], style, label=labels.get(what))
        if what == "floor":
            ax.plot([r["hosts"] for r in rows], [2 * r["median_s"] + 1.5 for r in rows], color="0.7", linewidth=4,
                    alpha=0.5, label="goal for launch: 2 x floor + 1.5 s")
    hosts = sorted({r["hosts"] for r in result["rows"] if r["program"] == "trivial"})
    ax.set_xscale("log", base=2)
    ax.set_xticks(hosts, [str(h) for h in hosts])
    each = result["tasks_per_host"]
    ax.set_xlabel(f"hosts ({each} task{'s' if each > 1 else ''} each; network namespaces on one machine)")
    ax.set_ylabel("seconds, start to end of `python -c 'print(1)'`")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_shapes(result: dict, path: pathlib.Path, plt) -> None:
    """Runs of several shapes (hosts x tasks per host): for each, the floor, the goal and the launches
    side by side, and what a restart adds with the host agent and without it."""
    rows = {(r["hosts"], r["tasks_per_host"], r["measure"]): r["median_s"] for r in result["rows"]
            if r["program"] == "trivial"}
    shapes = sorted({(h, t) for h, t, _ in rows}, key=lambda shape: (shape[1], shape[0]))
    bars = [("floor", "OpenSSH floor", lambda h, t: rows.get((h, t, "floor"))),
            ("goal", "goal: 2 x floor + 1.5 s",
             lambda h, t: rows.get((h, t, "floor")) and 2 * rows[(h, t, "floor")] + 1.5),
            ("launch", "mgpu launch (host agent)", lambda h, t: rows.get((h, t, "launch"))),
            ("launch_no_agent", "mgpu launch --no-host-agent", lambda h, t: rows.get((h, t, "launch_no_agent"))),
            ("restart", "a restart adds (host agent)", lambda h, t: _difference(rows, h, t, "restart", "launch")),
            ("restart_no_agent", "a restart adds (--no-host-agent)",
             lambda h, t: _difference(rows, h, t, "restart_no_agent", "launch_no_agent"))]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(bars)
    for i, (_, label, value) in enumerate(bars):
        ax.bar([x + i * width for x in range(len(shapes))], [value(h, t) or 0 for h, t in shapes], width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], [f"{h} hosts x {t}" for h, t in shapes])
    ax.set_ylabel("seconds, start to end of `python -c 'print(1)'`")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _difference(rows: dict, hosts: int, each: int, measure: str, than: str) -> float | None:
    a, b = rows.get((hosts, each, measure)), rows.get((hosts, each, than))
    return a - b if a is not None and b is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="2,4,8,16",
                        help="host counts, comma-separated; HxT: H hosts with T tasks each (else --tasks-per-host)")
    parser.add_argument("--trainer-hosts", default="2,4",
                        help="host counts at which the built-in trainer is timed too; none: not at all")
    parser.add_argument("--tasks-per-host", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measures", default=",".join(MEASURES), help="which of them, comma-separated")
    parser.add_argument("--name", default="startup", help="results file name, without suffix")
    parser.add_argument("--no-plot", action="store_true",
                        help=f"do not write {PLOT.relative_to(REPO)} (docs/NAME.png for another --name)")
    parser.add_argument("--baseline-label", default="before", help="what the baseline is, for the page")
    parser.add_argument("--baseline", type=pathlib.Path, metavar="CHECKOUT",
                        help="another mgpu checkout (e.g. `git worktree add /tmp/base v1.0`) whose check and launch "
                             "are timed too, interleaved with this one's")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("startup.py needs root (network namespaces and sshd)", file=sys.stderr)
        return 2
    def shapes(counts: str) -> list[tuple[int, int]]:
        return [(int(n.partition("x")[0]), int(n.partition("x")[2] or args.tasks_per_host)) for n in counts.split(",")]
    counts = shapes(args.hosts)
    trainer_counts = [] if args.trainer_hosts == "none" else shapes(args.trainer_hosts)
    started = time.time()
    rows, load = run(counts, trainer_counts, args.repeats, args.baseline and args.baseline.resolve(),
                     tuple(args.measures.split(",")))
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "repeats": args.repeats,
              "baseline": args.baseline_label if args.baseline else None, "load": load,
              "tasks_per_host": args.tasks_per_host, "wall_time_s": round(time.time() - started, 1), "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    if not args.no_plot:
        plot(result, PLOT if args.name == "startup" else REPO / "docs" / f"{args.name}.png")
    for row in rows:
        print(f"{row['hosts']:>3} hosts x {row['tasks_per_host']} {row['program']:<8} {row['measure']:<16} "
              f"{row['median_s'] or 0:7.2f} s"
              + (f"  {row['peak_rss_mb']:.0f} MB" if row["peak_rss_mb"] else "")
              + (f"  {len(row['failed'])} failed" if row["failed"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
