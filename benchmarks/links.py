#!/usr/bin/env python3
"""Two hosts joined by a link of real speed: mgpu's 2-worker efficiency beside torchrun + DDP.

Makes two hosts as network namespaces (h1, h2) joined by a bridge, each with one interface, eth0,
and for each link shapes both interfaces' egress with `tc qdisc ... tbf rate R burst 256kb
latency 50ms` (unshaped: no qdisc). On each link it runs, one worker per host, one thread per
worker, the seed CNN at 128 examples per replica on synthetic data:
- mgpu's trainer with its defaults (benchmarks/mwms_scaling.py),
- mgpu's trainer with every gradient all-reduced in float32 (--gradient-exchange allreduce),
- DDP over gloo on the same CNN, started as torchrun would (benchmarks/torch_ddp_peer.py), when
  torch is installed,
each at 1 and 2 workers, interleaved and repeated inside each script; medians are kept.
Efficiency = ex/s with 2 workers / (2 x ex/s with 1 worker) of the same configuration.

Writes benchmarks/results/links.json and links.md (the machine described), and removes the
namespaces at the end, also on Ctrl-C. Needs root, iproute2 and tc. Timings vary between
machines and with load: compare the rows of one run.

    sudo python benchmarks/links.py                     # unshaped, 10gbit, 1gbit; 3 repeats
    sudo python benchmarks/links.py --links 1gbit --repeats 1 --latency-ms 5
    sudo python benchmarks/links.py --links 1gbit --configs bfloat16,bfloat16-early,int8,int8-early
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
PREFIX = f"mgpulinks{os.getpid()}"
SUBNET = "10.216.7"
HOSTS = {"h1": f"{SUBNET}.11", "h2": f"{SUBNET}.12"}

# name: (label, script, options). The default set, then levers of the factors exchange.
CONFIGS = {
    "default": ("mgpu default", "mwms_scaling.py", []),
    "allreduce": ("mgpu allreduce float32", "mwms_scaling.py", ["--gradient-exchange", "allreduce"]),
    "ddp": ("torch DDP gloo", "torch_ddp_peer.py", []),
    # The factors exchange's levers, each named in full (the defaults may change).
    "bfloat16": ("mgpu factors bfloat16", "mwms_scaling.py", ["--factor-dtype", "bfloat16", "--factor-gather", "together"]),
    "bfloat16-early": ("mgpu factors bfloat16, early all-gather", "mwms_scaling.py",
                       ["--factor-dtype", "bfloat16", "--factor-gather", "early"]),
    "int8": ("mgpu factors int8", "mwms_scaling.py", ["--factor-dtype", "int8", "--factor-gather", "together"]),
    "int8-early": ("mgpu factors int8, early all-gather", "mwms_scaling.py",
                   ["--factor-dtype", "int8", "--factor-gather", "early"]),
}
DEFAULT_CONFIGS = "default,allreduce,ddp"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def namespace(name: str) -> str:
    return f"{PREFIX}-{name}"


def make_hosts() -> None:
    bridge = namespace("br")
    ip("netns", "add", bridge)
    ip("-n", bridge, "link", "add", "br0", "type", "bridge")
    ip("-n", bridge, "link", "set", "br0", "up")
    for name, address in HOSTS.items():
        ns = namespace(name)
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"port-{name}", "netns", bridge)
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", bridge, "link", "set", f"port-{name}", "master", "br0", "up")


def remove_hosts() -> None:
    for name in [*HOSTS, "br"]:
        subprocess.run(["ip", "netns", "delete", namespace(name)], capture_output=True)


def shape(rate: str | None, latency_ms: float) -> None:
    """Every host's egress at `rate` (None: unshaped), plus `latency_ms` of added delay."""
    for name in HOSTS:
        ns = namespace(name)
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True)
        if rate is None and not latency_ms:
            continue
        command = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root"]
        if latency_ms:
            command += ["handle", "1:", "netem", "delay", f"{latency_ms:g}ms"]
            subprocess.run(command, check=True, capture_output=True)
            if rate is None:
                continue
            command = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:"]
        subprocess.run(command + ["tbf", "rate", rate, "burst", "256kb", "latency", "50ms"], check=True,
                       capture_output=True)


def torch_available() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def run_config(script: str, extra: list[str], repeats: int, steps: int) -> dict:
    env = dict(os.environ, MGPU_BENCH_HOSTS=",".join(f"{namespace(n)}={a}" for n, a in HOSTS.items()),
               GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="=eth0")
    done = subprocess.run([sys.executable, str(HERE / script), "--workers", "1,2", "--repeats", str(repeats),
                           "--steps", str(steps), *extra], env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(extra)} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows_of(link: str, label: str, result: dict) -> list[dict]:
    """The 1- and 2-worker rows of one configuration on one link (interleaved.summarize's medians)."""
    one, two = result["w1"]["examples_per_s_median"], result["w2"]["examples_per_s_median"]
    return [{"link": link, "config": label, "workers": 1, "examples_per_sec": one, "efficiency": None},
            {"link": link, "config": label, "workers": 2, "examples_per_sec": two, "efficiency": result.get("scaling"),
             "cpu_bound": result.get("scaling_cpu_bound")}]


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python {platform.python_version()}"


def markdown(result: dict) -> str:
    lines = [f"# Two hosts over shaped links ({result['date']})", "", result["machine"], "",
             f"tbf burst 256kb latency 50ms on each host's egress; added latency {result['latency_ms']:g} ms; "
             f"{result['repeats']} repeats of {result['steps']} timed steps, medians."
             + (f" In each host: sysctl {', '.join(result['sysctl'])}." if result.get("sysctl") else ""), "",
             "| link | configuration | 1 worker ex/s | 2 workers ex/s | efficiency |", "|---|---|---|---|---|"]
    by_key: dict = {}
    for row in result["rows"]:
        by_key.setdefault((row["link"], row["config"]), {})[row["workers"]] = row
    for (link, config), rows in by_key.items():
        lines.append(f"| {link} | {config} | {rows[1]['examples_per_sec']:,.0f} | {rows[2]['examples_per_sec']:,.0f} | "
                     f"{rows[2]['efficiency']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", default="unshaped,10gbit,1gbit", help="comma-separated: unshaped or a tc rate")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay added on each host's egress (netem)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated, of: {', '.join(CONFIGS)}")
    parser.add_argument("--extra", default="", help="more mwms_scaling.py options for mgpu's configurations, "
                        "e.g. '--inter-op 2' (named in their labels)")
    parser.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE",
                        help="set in each host's namespace, e.g. net.ipv4.tcp_slow_start_after_idle=0")
    parser.add_argument("--results-dir", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--name", default="links", help="results file name, without suffix")
    args = parser.parse_args(argv)
    unknown = [name for name in args.configs.split(",") if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if os.geteuid() != 0:
        print("links.py needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    configs = [CONFIGS[name] for name in args.configs.split(",")]
    configs = [c for c in configs if c[1] != "torch_ddp_peer.py" or torch_available()]
    if args.extra:
        configs = [(f"{label} {args.extra}", script, [*extra, *shlex.split(args.extra)])
                   if script == "mwms_scaling.py" else (label, script, extra) for label, script, extra in configs]
    rows = []
    remove_hosts()
    try:
        make_hosts()
        for setting in args.sysctl:
            for name in HOSTS:
                subprocess.run(["ip", "netns", "exec", namespace(name), "sysctl", "-qw", setting], check=True)
        for link in args.links.split(","):
            shape(None if link == "unshaped" else link, args.latency_ms)
            for label, script, extra in configs:
                result = run_config(script, extra, args.repeats, args.steps)
                rows.extend(rows_of(link, label, result))
                print(f"{link:>9}  {label:<24} {rows[-2]['examples_per_sec']:>8,.0f} -> "
                      f"{rows[-1]['examples_per_sec']:>8,.0f} ex/s  efficiency {rows[-1]['efficiency']}", flush=True)
    finally:
        remove_hosts()
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "latency_ms": args.latency_ms,
              "sysctl": args.sysctl,
              "repeats": args.repeats, "steps": args.steps, "rows": rows}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results_dir / f"{args.name}.md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
