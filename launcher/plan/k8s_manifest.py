"""Kubernetes manifests for a job: a headless Service and an Indexed Job whose pods run mgpu's
pod bootstrap (launcher/bootstrap/k8s_pod.py). Pure: a K8sJob in, YAML text out.

Why these objects: an Indexed Job numbers its pods (JOB_COMPLETION_INDEX) and names pod i's
host `<job>-<i>`; with a headless Service as the pods' subdomain, every pod resolves every other
as `<job>-<i>.<service>`, which is all TF_CONFIG needs. The Service publishes pods before they
are ready, because TensorFlow's workers dial each other while they start.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

from launcher.config.k8s_env import pod_env

POD_BOOTSTRAP = "launcher.bootstrap.k8s_pod"
GPU_RESOURCE = "nvidia.com/gpu"
JOB_LABEL = "mgpu/job"


@dataclasses.dataclass(frozen=True)
class K8sJob:
    name: str  # the Job's and the Service's name
    image: str
    tasks: int
    chief: bool  # pod 0 is the chief
    port: int
    argv: tuple[str, ...]  # the program every pod runs
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    gpus_per_task: int = 0
    threads_per_task: int | None = None
    namespace: str | None = None
    python: str = "python3"  # the interpreter in the image that runs the bootstrap
    backoff_limit: int = 0  # pod failures before the Job fails (0: the first fails it, fail-fast)
    dns_timeout: float | None = None  # seconds a pod waits for the others' names; None: the bootstrap's default


class _Quoted(str):
    """A string value, written in double quotes."""


@functools.cache
def _dumper():
    """PyYAML's safe dumper, writing _Quoted values in double quotes. PyYAML is imported here, not
    with the module: the CLI imports every command's module at its start, where PyYAML would take
    about 15 ms of the 125 of every command, and only `mgpu k8s` writes YAML."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Quoted, lambda dumper, value: dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                                                                  style='"'))
    return Dumper


def _quoted(node):
    """`node` with every string value quoted (mapping keys, all of them mgpu's, stay plain): YAML 1.1
    readers such as kubectl's take a plain y, n, yes or off for a boolean, and refuse the manifest."""
    if isinstance(node, dict):
        return {key: _quoted(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_quoted(value) for value in node]
    return _Quoted(node) if isinstance(node, str) else node


def render_manifest(job: K8sJob) -> str:
    """The Service and the Job as one YAML stream (`kubectl apply -f -` takes it)."""
    import yaml

    return yaml.dump_all([_quoted(_service(job)), _quoted(_job(job))], Dumper=_dumper(), sort_keys=False,
                         default_flow_style=False, allow_unicode=False)


def _metadata(job: K8sJob) -> dict:
    metadata = {"name": job.name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "mgpu", JOB_LABEL: job.name}
    return metadata


def _service(job: K8sJob) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job),
        "spec": {
            "clusterIP": "None",  # headless: DNS names for the pods, no virtual IP
            "publishNotReadyAddresses": True,  # workers dial each other before any is "ready"
            "selector": {JOB_LABEL: job.name},
            "ports": [{"name": "cluster", "port": job.port}],
        },
    }


def _job(job: K8sJob) -> dict:
    env = pod_env(job.name, job.name, job.tasks, job.chief, job.port, job.threads_per_task, job.dns_timeout)
    env.update(job.env)
    container = {
        "name": "task",
        "image": job.image,
        "command": [job.python, "-m", POD_BOOTSTRAP, "--", *job.argv],
        "env": [{"name": name, "value": value} for name, value in env.items()],
        "ports": [{"name": "cluster", "containerPort": job.port}],
    }
    if job.gpus_per_task:
        container["resources"] = {"limits": {GPU_RESOURCE: job.gpus_per_task}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job),
        "spec": {
            "completionMode": "Indexed",
            "completions": job.tasks,
            "parallelism": job.tasks,  # every task at once: a collective needs all its members
            "backoffLimit": job.backoff_limit,
            "template": {
                "metadata": {"labels": {JOB_LABEL: job.name}},
                "spec": {
                    "subdomain": job.name,  # the Service: pod i is <name>-<i>.<name>
                    "restartPolicy": "Never",
                    "containers": [container],
                },
            },
        },
    }
