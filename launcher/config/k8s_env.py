"""What a pod of an `mgpu k8s` job says about itself, read from its environment.

Pure: the environment is passed in. An Indexed Job gives each pod JOB_COMPLETION_INDEX; the
manifest `mgpu k8s` writes gives every pod the job's name, its headless Service and the task
layout. With the Service as the pods' subdomain, Kubernetes' DNS names pod i
`<job>-<i>.<service>`: the addresses TF_CONFIG lists.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from launcher.config.addresses import is_number
from launcher.config.hostlist import MAX_TASKS
from launcher.config.spec import CHIEF, MAX_SECONDS, WORKER, ClusterSpec, TaskSpec
from launcher.errors import UsageError

ENV_INDEX = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every pod of an Indexed Job
ENV_JOB = "MGPU_K8S_JOB"
ENV_SERVICE = "MGPU_K8S_SERVICE"
ENV_TASKS = "MGPU_K8S_TASKS"  # how many pods the job has
ENV_CHIEF = "MGPU_K8S_CHIEF"  # "1": pod 0 is the chief, the others workers
ENV_PORT = "MGPU_K8S_PORT"
ENV_THREADS = "MGPU_K8S_THREADS"  # optional: threads per task, as --threads-per-task
ENV_DNS_TIMEOUT = "MGPU_K8S_DNS_TIMEOUT"  # optional: seconds a pod waits for the others' names
POD_ENV = (ENV_JOB, ENV_SERVICE, ENV_TASKS, ENV_CHIEF, ENV_PORT)
# Set by Kubernetes only where the container does not set it: a manifest that did would make every pod pod 0.
RESERVED_ENV = (ENV_INDEX,)
# The numbers of a pod's environment: a pod index, a task count, a port, threads. Longer ones are
# mistakes, and int() of thousands of digits is slow or refused.
MAX_DIGITS = 9

NOT_IN_A_POD = (
    "not in a pod of an `mgpu k8s` job: {name} is not set (Kubernetes sets JOB_COMPLETION_INDEX in "
    "the pods of an Indexed Job; the manifest of `mgpu k8s` sets the MGPU_K8S_* variables)"
)


@dataclasses.dataclass(frozen=True)
class PodJob:
    """The job as every one of its pods sees it, and which pod this is."""

    job: str
    service: str
    tasks: int
    chief: bool
    port: int
    index: int  # this pod's JOB_COMPLETION_INDEX
    threads_per_task: int | None = None

    def host(self, index: int) -> str:
        """Pod `index`'s DNS name: its hostname in the Service's subdomain."""
        return f"{self.job}-{index}.{self.service}"

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self.host(i) for i in range(self.tasks))

    def role(self, index: int) -> tuple[str, int]:
        """(task type, task index) of pod `index`."""
        if self.chief:
            return (CHIEF, 0) if index == 0 else (WORKER, index - 1)
        return WORKER, index

    def cluster_spec(self, command: tuple[str, ...]) -> ClusterSpec:
        """The cluster: pod i at its DNS name on the job's port, each running `command`."""
        roles = [self.role(i)[0] for i in range(self.tasks)]
        return ClusterSpec(tasks=tuple(TaskSpec(role, host, self.port) for role, host in zip(roles, self.hosts)),
                           command=command, threads_per_task=self.threads_per_task)


def pod_env(job: str, service: str, tasks: int, chief: bool, port: int,
            threads_per_task: int | None = None, dns_timeout: float | None = None) -> dict[str, str]:
    """The variables a manifest gives every pod (what read_pod reads back)."""
    env = {ENV_JOB: job, ENV_SERVICE: service, ENV_TASKS: str(tasks), ENV_CHIEF: "1" if chief else "0",
           ENV_PORT: str(port)}
    if threads_per_task:
        env[ENV_THREADS] = str(threads_per_task)
    if dns_timeout is not None:
        env[ENV_DNS_TIMEOUT] = f"{dns_timeout:g}"
    return env


def read_pod(env: Mapping[str, str]) -> PodJob:
    """This pod's job; UsageError naming what is missing or wrong outside such a pod."""
    for name in (ENV_INDEX, *POD_ENV):
        if not env.get(name):
            raise UsageError(NOT_IN_A_POD.format(name=name))
    numbers = {}
    for name in (ENV_INDEX, ENV_TASKS, ENV_PORT, ENV_THREADS):
        if name == ENV_THREADS and not env.get(name):
            continue
        text = env[name]
        if not is_number(text):
            raise UsageError(f"{name} {_shown(text)} is not a number (ASCII digits)")
        if len(text) > MAX_DIGITS:
            raise UsageError(f"{name} {_shown(text)} has more than {MAX_DIGITS} digits")
        numbers[name] = int(text)
    tasks, index, port = numbers[ENV_TASKS], numbers[ENV_INDEX], numbers[ENV_PORT]
    if not 1 <= tasks <= MAX_TASKS:
        raise UsageError(f"{ENV_TASKS} {tasks} is not between 1 and {MAX_TASKS}, the most tasks mgpu runs")
    if not 1 <= port <= 65535:
        raise UsageError(f"{ENV_PORT} {port} is not a TCP port (1-65535)")
    if not 0 <= index < tasks:
        raise UsageError(f"{ENV_INDEX} {index} is out of range: the job has {tasks} pods (0-{tasks - 1})")
    return PodJob(env[ENV_JOB], env[ENV_SERVICE], tasks, env[ENV_CHIEF] == "1", port, index,
                  numbers.get(ENV_THREADS) or None)


def dns_timeout(env: Mapping[str, str], default: float) -> float:
    """MGPU_K8S_DNS_TIMEOUT in seconds (`default` when unset): a finite number from 0 to a month."""
    text = env.get(ENV_DNS_TIMEOUT, "")
    if not text:
        return default
    try:
        if not text.isascii():  # float() also reads '٣'
            raise ValueError(text)
        seconds = float(text)
    except ValueError:
        raise UsageError(f"{ENV_DNS_TIMEOUT} {_shown(text)} is not a number of seconds") from None
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
        raise UsageError(f"{ENV_DNS_TIMEOUT} {_shown(text)} is not between 0 and {MAX_SECONDS:.0f} seconds (30 days)")
    return seconds


def _shown(text: str, limit: int = 40) -> str:
    """A value for an error line: quoted, and cut short."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"
