"""`mgpu k8s`: the manifests that run a job on Kubernetes (a headless Service and an Indexed Job)."""

from __future__ import annotations

import dataclasses
import re

import click

from launcher.cli import params
from launcher.cli.main import cli
from launcher.cli.options import check_text, task_settings
from launcher.config.k8s_env import RESERVED_ENV, PodJob
from launcher.intake.load import HostsRequest, read_spec, with_command_line, with_task_settings
from launcher.config.spec import EVALUATOR, MAX_GPUS_PER_TASK, MAX_LOCAL_TASKS, MAX_THREADS_PER_TASK, ClusterSpec
from launcher.errors import UsageError
from launcher.plan.k8s_manifest import K8sJob, render_manifest
from launcher.plan.planner import plan_tasks

K8S_HELP = """Print the Kubernetes manifests that run a job: a headless Service and an
Indexed Job with one pod per task. Apply them with `kubectl apply -f -`.

Every pod runs mgpu's pod bootstrap, which derives its TF_CONFIG and the Keras,
PyTorch and JAX variables from its index, waits until the other pods' names
resolve, then starts the program. The image needs mgpu installed
(`pip install mgpu`, with the `train` extra for the built-in trainer).

With no COMMAND, every pod runs the built-in trainer; arguments after `--` that
start with a dash go to it.

\b
Examples:
  mgpu k8s --workers 4 --image registry.example.com/train:1 -- python train.py
  mgpu k8s --workers 2 --chief --image my/train:1 --gpus-per-task 1 | kubectl apply -f -
  mgpu k8s --spec cluster.yaml --image my/train:1 --name resnet-run7
"""

# Kubernetes' names: a Service's is a DNS-1035 label (it starts with a letter), a namespace's a
# DNS-1123 label. The Job's name is also the first part of every pod's hostname.
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_LABEL = 63
# An image reference as container runtimes parse it (the distribution project's grammar): an
# optional registry host[:port], path components of lower-case letters and digits joined by
# '.', '_', '__' or dashes, then an optional :tag and @digest. The kubelet refuses others
# (InvalidImageName) only once a pod is scheduled.
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
                    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*"
                    r":[0-9A-Fa-f]{32,})?")
MAX_IMAGE_NAME = 255  # the registry and path, without tag and digest


@cli.command("k8s", help=K8S_HELP)
@click.option("--workers", type=params.Count(min=1, max=MAX_LOCAL_TASKS), metavar="N",
              help="How many worker pods (required without --spec).")
@click.option("--chief", is_flag=True, help="One more pod, pod 0, as the chief.")
@click.option("--spec", "spec_file", type=params.InputFile(), metavar="FILE",
              help="Take the task count (chief and workers), command, env, threads and GPUs from a spec file; "
                   "its hosts do not apply (Kubernetes places the pods).")
@click.option("--image", required=True, metavar="IMAGE", help="The container image every pod runs.")
@click.option("--name", default="mgpu", show_default=True, metavar="NAME",
              help="The Job's and the Service's name; pod i is NAME-i.NAME.")
@click.option("--namespace", metavar="NS", help="The namespace of both objects (default: kubectl's).")
@click.option("--port", type=params.PORT, default=2222, show_default=True, help="The port every task listens on.")
@click.option("--gpus-per-task", type=params.Count(min=0, max=MAX_GPUS_PER_TASK), metavar="K",
              help="GPUs per pod (resources.limits nvidia.com/gpu).")
@click.option("--threads-per-task", type=params.Count(min=1, max=MAX_THREADS_PER_TASK), metavar="K",
              help="Threads per task (OMP_NUM_THREADS, TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS).")
@click.option("--env", "env_pairs", type=params.ENV_ASSIGNMENT, multiple=True, metavar="NAME=VALUE",
              help="An environment variable for every pod; repeatable. Values are written into the "
                   "manifest: keep credentials in a Secret instead.")
@click.option("--env-file", type=params.InputFile(), metavar="FILE", help="NAME=VALUE lines, as --env.")
@click.option("--python", default="python3", show_default=True, metavar="PATH",
              help="The interpreter in the image that runs the bootstrap (and the built-in trainer).")
@click.option("--backoff-limit", type=params.Count(min=0, max=1000), default=0, show_default=True,
              help="Pod failures before the Job fails. 0: the first failure fails the Job and Kubernetes "
                   "stops the other pods (fail-fast).")
@click.option("--dns-timeout", type=params.Seconds(0), default=600.0, show_default=True, metavar="SECONDS",
              help="How long each pod waits for the other pods' names to resolve.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def k8s_command(**opts) -> None:
    command = opts.pop("command")
    check_text(opts, command)
    spec = with_command_line(_spec(opts), command)
    tasks = len(spec.tasks)
    chief = spec.tasks[0].role != "worker"
    _check_name(opts["name"], tasks)
    _check_namespace(opts["namespace"])
    _check_image(opts["image"])
    for name in RESERVED_ENV:
        if name in spec.env:
            raise UsageError(f"environment variable {name} is set by Kubernetes for each pod and cannot be given "
                             "(set in the manifest, it would make every pod pod 0)")
    pod = PodJob(opts["name"], opts["name"], tasks, chief, opts["port"], 0, spec.threads_per_task)
    # Planned as the pods will plan it: bad env names and commands fail here, before any manifest.
    plan = plan_tasks(ClusterSpec(tasks=pod.cluster_spec(()).tasks, command=spec.command,
                                  trainer_args=spec.trainer_args, env=spec.env, python=spec.python,
                                  threads_per_task=spec.threads_per_task),
                      run_id=opts["name"], local_hosts=frozenset(), launcher_python=opts["python"], slurm=True)[0]
    job = K8sJob(name=opts["name"], image=opts["image"], tasks=tasks, chief=chief, port=opts["port"],
                 argv=plan.argv, env=spec.env, dns_timeout=opts["dns_timeout"], gpus_per_task=spec.gpus_per_task or 0,
                 threads_per_task=spec.threads_per_task, namespace=opts["namespace"], python=opts["python"],
                 backoff_limit=opts["backoff_limit"])
    click.echo(render_manifest(job), nl=False)


def _spec(opts: dict) -> ClusterSpec:
    """The tasks and settings: --workers/--chief or a spec file, with the options over it."""
    from launcher.config.spec import TaskSpec

    if opts["spec_file"] and (opts["workers"] or opts["chief"]):
        raise UsageError("give either --spec or --workers (and --chief), not both")
    if opts["spec_file"]:
        spec = read_spec(HostsRequest(spec_file=opts["spec_file"]))
        if any(task.role == EVALUATOR for task in spec.tasks):
            raise UsageError(f"--spec {opts['spec_file']}: an evaluator is not supported on Kubernetes yet: "
                             "run it as a Deployment of its own, or drop it from the spec")
        if any(task.role == "ps" for task in spec.tasks):
            raise UsageError(f"--spec {opts['spec_file']}: parameter servers are not supported on Kubernetes yet: "
                             "the pods' Job would wait for them, which serve until stopped")
    elif opts["workers"]:
        roles = ["chief"] * opts["chief"] + ["worker"] * opts["workers"]
        spec = ClusterSpec(tasks=tuple(TaskSpec(role, "pod", opts["port"]) for role in roles))
    else:
        raise UsageError("give --workers N (or --spec FILE)")
    # --python is the image's interpreter for the bootstrap; the spec's own python still runs its trainer.
    return with_task_settings(spec, dataclasses.replace(task_settings(opts), python=None))


def _check_name(name: str, tasks: int) -> None:
    longest = f"{name}-{tasks - 1}"
    if not _DNS_1035_LABEL.fullmatch(name) or len(longest) > MAX_LABEL:
        raise UsageError(f"--name {name[:80]!r}: the Service's name and the pods' hostnames ({longest[:80]}) must be "
                         f"DNS labels: lower-case letters, digits and '-', at most {MAX_LABEL} characters, starting "
                         "with a letter and ending with a letter or digit")


def _check_namespace(namespace: str | None) -> None:
    if namespace is not None and not (_DNS_1123_LABEL.fullmatch(namespace) and len(namespace) <= MAX_LABEL):
        raise UsageError(f"--namespace {namespace[:80]!r}: a namespace is a DNS label: lower-case letters, digits "
                         f"and '-', at most {MAX_LABEL} characters, starting and ending with a letter or digit")


def _check_image(image: str) -> None:
    name = image.partition("@")[0]
    if ":" in name.rpartition("/")[2]:
        name = name.rpartition(":")[0]
    if not _IMAGE.fullmatch(image) or len(name) > MAX_IMAGE_NAME:
        raise UsageError(f"--image {image[:120]!r} is not an image reference such as registry.example.com/team/"
                         f"train:1 (lower-case path, optional :tag and @sha256:digest, at most {MAX_IMAGE_NAME} "
                         "characters before the tag)")
