"""Where a benchmark's workers run: on this machine (127.0.0.1), or, when MGPU_BENCH_HOSTS is set
(by benchmarks/links.py), worker i in network namespace i at that namespace's address, so that
their traffic crosses a link that can be shaped.

MGPU_BENCH_HOSTS="ns1=10.0.0.11,ns2=10.0.0.12": namespace=address, one per worker, in order.
"""

from __future__ import annotations

import os

ENV_HOSTS = "MGPU_BENCH_HOSTS"


def bench_hosts() -> list[tuple[str, str]]:
    """[(namespace, address)] from the environment; [] when the workers run on this machine."""
    text = os.environ.get(ENV_HOSTS, "")
    hosts = []
    for item in filter(None, text.split(",")):
        namespace, _, address = item.partition("=")
        hosts.append((namespace, address))
    return hosts


def worker_address(index: int, default: str = "127.0.0.1") -> str:
    hosts = bench_hosts()
    return hosts[index][1] if hosts else default


def in_worker_host(command: list[str], index: int) -> list[str]:
    """`command` as worker `index` runs it: in its namespace, when there are namespaces."""
    hosts = bench_hosts()
    if not hosts:
        return command
    if index >= len(hosts):
        raise RuntimeError(f"{ENV_HOSTS} names {len(hosts)} hosts; worker {index} has none")
    return ["ip", "netns", "exec", hosts[index][0], *command]
