"""The task side of an `mgpu k8s` job: `python -m launcher.bootstrap.k8s_pod -- PROGRAM...`, the
command of every pod.

It reads which pod it is (JOB_COMPLETION_INDEX) and the job's layout (MGPU_K8S_*) from the
environment the manifest gives it, plans the cluster as `mgpu launch` would (TF_CONFIG, the
Keras, PyTorch and JAX variables, the task variables), waits until every pod's DNS name
resolves, gives NCCL and Gloo the interface it reaches the other pods through, and then execs
the program, so that Kubernetes' signals and exit status concern the program itself.

Why wait: a headless Service names a pod only once the pod exists and has an address, and the
pods of a job start in any order; TensorFlow and gRPC give up on a name that does not resolve.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable, Sequence

from launcher.config.k8s_env import dns_timeout, read_pod
from launcher.errors import EXIT_USAGE, UsageError
from launcher.host.interfaces import interface_toward
from launcher.plan.network import INTERFACE_ENV, interface_env
from launcher.plan.planner import pod_plan

DNS_TIMEOUT = 600.0  # seconds: pods of a big job may wait minutes for a node or an image pull
DNS_RETRY = 1.0
EXIT_PEERS_UNRESOLVED = 3
EXIT_CANNOT_START = 127


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        return True
    except (OSError, UnicodeError):
        return False


def wait_for_names(hosts: Sequence[str], timeout: float, resolve: Callable[[str], bool] = resolves,
                   on_wait: Callable[[list[str]], None] = lambda pending: None,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Wait until every name in `hosts` resolves, at most `timeout` seconds; the names that still
    do not ([] when all do). `on_wait` hears the first names that do not, once."""
    deadline = clock() + timeout
    pending = list(hosts)
    waited = False
    while True:
        pending = [host for host in pending if not resolve(host)]
        if not pending or clock() >= deadline:
            return pending
        if not waited:
            on_wait(pending)
            waited = True
        sleep(min(DNS_RETRY, max(0.0, deadline - clock())))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    try:
        pod = read_pod(os.environ)
        plan = pod_plan(pod, args, sys.executable)
        timeout = dns_timeout(os.environ, DNS_TIMEOUT)
    except UsageError as exc:
        print(f"mgpu: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    def waiting(pending: list[str]) -> None:
        print(f"mgpu: {plan.name} (pod {pod.index}): waiting up to {timeout:g} s for these pods' names to resolve: "
              f"{', '.join(pending)}", file=sys.stderr, flush=True)

    unresolved = wait_for_names(pod.hosts, timeout, on_wait=waiting)
    if unresolved:
        print(f"mgpu: {plan.name} (pod {pod.index}): these pods' names did not resolve within {timeout:g} s: "
              f"{', '.join(unresolved)} (is the headless Service {pod.service} in this namespace, and are those "
              f"pods running?)", file=sys.stderr, flush=True)
        return EXIT_PEERS_UNRESOLVED
    env = {**os.environ, **plan.env}
    if not any(name in env for name in INTERFACE_ENV):
        interface = interface_toward(pod.hosts, pod.host(pod.index))
        if interface:
            env.update(interface_env(interface))
    try:
        os.execvpe(plan.argv[0], list(plan.argv), env)
    except OSError as exc:
        print(f"mgpu: {plan.name}: cannot start {plan.argv[0]!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
    return EXIT_CANNOT_START


if __name__ == "__main__":
    sys.exit(main())
