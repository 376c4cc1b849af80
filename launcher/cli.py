"""The `mgpu` command line. Errors are caught once, in main(), and become exit codes."""

from __future__ import annotations

import os
import secrets
import sys
import time
import traceback

import click

from launcher import __version__
from launcher import params
from launcher.errors import EXIT_INTERRUPTED, MgpuError, UsageError
from launcher.spec import ROLES, WORKER, ClusterSpec, SshSettings

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# `--chief` and `--evaluator` given without a value under --local: run that role on this machine too.
_THIS_MACHINE = object()

_debug = False


class MgpuGroup(click.Group):
    """The top-level group: every error becomes one line on stderr and an exit code."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args=args, prog_name=prog_name or "mgpu", standalone_mode=False,
                                auto_envvar_prefix="MGPU", **extra)
            code = code if isinstance(code, int) else 0
        except click.exceptions.Exit as exc:
            code = exc.exit_code
        except click.ClickException as exc:
            click.echo(f"mgpu: error: {exc.format_message()}", err=True)
            code = exc.exit_code
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo("mgpu: interrupted", err=True)
            code = EXIT_INTERRUPTED
        except MgpuError as exc:
            if _debug:
                traceback.print_exc()
            click.echo(f"mgpu: error: {exc}", err=True)
            code = exc.exit_code
        except Exception as exc:  # a bug: one line, and the traceback on request
            if _debug:
                traceback.print_exc()
            click.echo(f"mgpu: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                       err=True)
            code = 1
        sys.exit(code)


@click.group(cls=MgpuGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="mgpu")
@click.option("--debug", is_flag=True, help="Show the traceback of errors.")
def cli(debug: bool) -> None:
    """Launch and supervise multi-worker TensorFlow training, locally or over SSH.

    \b
    Examples:
      mgpu launch --local 2                          # a 2-worker cluster on this machine
      mgpu launch --workers h1:2222,h2:2222 -- python train.py
      mgpu launch --spec cluster.yaml --dry-run      # show what would run, start nothing
      mgpu tf-config --workers h1:2222,h2:2222 --task-index 1 --format env

    Every option can also be set from the environment as MGPU_<COMMAND>_<OPTION>,
    for example MGPU_LAUNCH_WORKERS=h1:2222,h2:2222.
    """
    global _debug
    _debug = debug


def cluster_options(func):
    """Options that say which tasks make up the cluster: shared by launch, tf-config and check."""
    options = [
        click.option("--workers", type=params.ENDPOINT_LIST, metavar="HOST[:PORT],...",
                     help="Worker hosts, comma-separated: host, host:port, user@host:port or [IPv6]:port."),
        click.option("--chief", type=params.ENDPOINT, is_flag=False, flag_value=_THIS_MACHINE,
                     metavar="HOST:PORT", help="A chief task (task type 'chief'). With --local, no value."),
        click.option("--evaluator", type=params.ENDPOINT, is_flag=False, flag_value=_THIS_MACHINE,
                     metavar="HOST", help="A sidecar evaluator (not part of the cluster). With --local, no value."),
        click.option("--port", type=params.PORT, default=2222, show_default=True,
                     help="Port for hosts listed without one."),
        click.option("--hostfile", type=click.Path(dir_okay=False), metavar="FILE",
                     help="Workers from a file: 'host[:port]' per line, or 'host slots=N' (N tasks on consecutive ports)."),
        click.option("--spec", "spec_file", type=click.Path(dir_okay=False), metavar="FILE",
                     help="A YAML or JSON cluster spec (see the README for its schema)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def ssh_options(func):
    options = [
        click.option("--ssh-user", help="SSH user for hosts that name none."),
        click.option("--ssh-port", type=params.PORT, help="SSH port for hosts that name none."),
        click.option("--identity", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
                     help="SSH private key file."),
        click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
                     help="An OpenSSH config file to use instead of ~/.ssh/config."),
        click.option("--known-hosts", type=click.Path(dir_okay=False), metavar="FILE",
                     help="A known_hosts file to trust besides ~/.ssh/known_hosts."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record keys of hosts not seen before (like StrictHostKeyChecking=accept-new). "
                          "A changed key is always refused."),
        click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
                     metavar="SECONDS", help="Timeout for each SSH connection."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def read_spec(opts: dict, local: int | None = None) -> ClusterSpec:
    """The ClusterSpec that the options describe. Exactly one source of hosts must be given."""
    from launcher.spec import build_tasks, expand_slots, load_spec_text, local_tasks, parse_hostfile

    sources = [name for name, given in (("--workers", opts.get("workers")), ("--hostfile", opts.get("hostfile")),
                                        ("--spec", opts.get("spec_file")), ("--local", local is not None)) if given]
    if len(sources) > 1:
        raise UsageError(f"give only one of {' and '.join(sources)}")
    if not sources:
        raise UsageError("no hosts: give --workers, --hostfile, --spec or --local")
    chief, evaluator = opts.get("chief"), opts.get("evaluator")
    for flag, value in (("--chief", chief), ("--evaluator", evaluator)):
        if local is None and value is _THIS_MACHINE:
            raise UsageError(f"{flag} needs a host here (it takes no value only with --local)")
        if local is not None and value not in (None, _THIS_MACHINE):
            raise UsageError(f"with --local, {flag} takes no value: every task runs on this machine")
    ssh_defaults = SshSettings(user=opts.get("ssh_user"), port=opts.get("ssh_port"),
                               identity_file=opts.get("identity"))

    if opts.get("spec_file"):
        if chief or evaluator:
            raise UsageError("--chief and --evaluator cannot be combined with --spec: put them in the spec file")
        path = opts["spec_file"]
        return load_spec_text(_read_text(path, "--spec"), path).cluster_spec(ssh_defaults)
    if local is not None:
        from launcher.ports import pick_free_ports

        with_chief = chief is _THIS_MACHINE
        return ClusterSpec(tasks=local_tasks(pick_free_ports(local + with_chief), with_chief,
                                             with_evaluator=evaluator is _THIS_MACHINE))
    if opts.get("hostfile"):
        path = opts["hostfile"]
        workers = expand_slots(parse_hostfile(_read_text(path, "--hostfile"), path), opts["port"])
    else:
        workers = opts["workers"]
    return ClusterSpec(tasks=build_tasks(chief, workers, evaluator, opts["port"]), ssh_defaults=ssh_defaults)


def _read_text(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path}: not a text file") from None


def make_plans(spec: ClusterSpec, run_id: str, count_gpus: bool = True):
    """Plans for the spec. `count_gpus` False skips nvidia-smi where CUDA_VISIBLE_DEVICES is not shown."""
    from launcher.gpus import detect_gpus
    from launcher.localhost import local_host_names
    from launcher.plan import plan_tasks

    return plan_tasks(
        spec,
        run_id=run_id,
        local_hosts=local_host_names(),
        launcher_python=sys.executable,
        local_gpu_count=detect_gpus() if count_gpus else 0,
    )


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


# ---------------------------------------------------------------------------
# mgpu launch

LAUNCH_HELP = """Start one process per task, locally or over SSH, and supervise them.

\b
Hosts come from exactly one of --workers, --hostfile, --spec or --local.
With no COMMAND, every task runs the built-in trainer (`mgpu train`) with this
launcher's Python (remote hosts: --python, default python3). Arguments after
`--` that start with a dash are passed to the trainer; anything else is a
command that runs in every task with TF_CONFIG set.

\b
Examples:
  mgpu launch --local 2
  mgpu launch --local 2 --chief --evaluator -- --train-steps 500 --model-dir /tmp/m
  mgpu launch --workers h1:2222,h2:2222 -- python train.py --epochs 3
  mgpu launch --hostfile hosts.txt --port 23456 --dry-run --json
  mgpu launch --spec cluster_specs/chief_workers_evaluator.yaml --max-restarts 2

Exit codes: 0 success, 1 a task failed, 2 bad input, 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP.
"""


@cli.command("launch", help=LAUNCH_HELP)
@cluster_options
@click.option("--local", type=click.IntRange(min=1), metavar="N",
              help="Simulate a cluster of N workers as processes on this machine (ports chosen free).")
@click.option("--dry-run", is_flag=True, help="Print every task's command, env and TF_CONFIG; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print the plan as JSON only.")
@click.option("--run-id", type=params.RUN_ID, help="Name of this run (default: time and a random suffix); tags every task.")
@click.option("--log-dir", type=click.Path(file_okay=False), default="mgpu-runs", show_default=True,
              help="Where each run's logs and run.json go, under a folder named by the run id.")
@click.option("--timestamps", is_flag=True, help="Prefix console lines with the time.")
@click.option("--show", type=params.TASK_SELECTORS, metavar="TYPE[:INDEX],...",
              help="Show only these tasks on the console (logs still get everything), e.g. chief,worker:0.")
@click.option("--grace-period", type=click.FloatRange(min=0), default=10.0, show_default=True, metavar="SECONDS",
              help="Time between TERM and KILL when stopping tasks.")
@click.option("--start-timeout", type=click.FloatRange(min=0.1), default=120.0, show_default=True, metavar="SECONDS",
              help="Stop the cluster if a task has not reported ready by then.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Restart the whole cluster after a failure, up to N times.")
@click.option("--threads-per-task", type=click.IntRange(min=1), metavar="K",
              help="TF intra-op and inter-op threads, and OMP_NUM_THREADS, for every task.")
@click.option("--gpus-per-task", type=click.IntRange(min=0), metavar="K",
              help="GPUs per task, as CUDA_VISIBLE_DEVICES (default: split this host's GPUs evenly; none: empty).")
@click.option("--env", "env_pairs", type=params.ENV_ASSIGNMENT, multiple=True, metavar="NAME=VALUE",
              help="Set an environment variable in every task (repeatable).")
@click.option("--env-file", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Set environment variables from a file of NAME=VALUE lines.")
@click.option("--forward-env", type=params.ENV_NAME, multiple=True, metavar="NAME",
              help="Pass this variable of the launcher's environment on to every task (repeatable).")
@click.option("--workdir", metavar="DIR", help="Working directory of every task (default: the launcher's, or the remote login dir).")
@click.option("--python", metavar="PATH", help="Interpreter that runs the built-in trainer.")
@ssh_options
@click.option("--no-check", is_flag=True, help="Skip the pre-launch checks of remote hosts.")
@click.option("--allow-public", is_flag=True, help="Do not warn about workers on public addresses.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch_command(**opts) -> None:
    import dataclasses

    from launcher.spec import parse_env_file

    if opts["as_json"] and not opts["dry_run"]:
        raise UsageError("--json goes with --dry-run")
    command = opts.pop("command")
    spec = read_spec(opts, opts["local"])
    spec = with_command_line(spec, command)
    env = dict(spec.env)
    if opts["env_file"]:
        env.update(parse_env_file(_read_text(opts["env_file"], "--env-file"), opts["env_file"]))
    for name in opts["forward_env"]:
        if name not in os.environ:
            raise UsageError(f"--forward-env {name}: {name} is not set in this environment")
        env[name] = os.environ[name]
    env.update(opts["env_pairs"])
    spec = dataclasses.replace(
        spec,
        env=env,
        workdir=opts["workdir"] or spec.workdir,
        python=opts["python"] or spec.python,
        threads_per_task=opts["threads_per_task"] or spec.threads_per_task,
        gpus_per_task=opts["gpus_per_task"] if opts["gpus_per_task"] is not None else spec.gpus_per_task,
    )
    run_id = opts["run_id"] or new_run_id()
    plans = make_plans(spec, run_id)

    if opts["dry_run"]:
        from launcher.plan import plan_to_json, render_plan_text

        if opts["as_json"]:
            import json

            click.echo(json.dumps(plan_to_json(plans), indent=2))
        else:
            click.echo(render_plan_text(plans))
        return

    from launcher.launch import launch

    launch(plans, run_id, opts)


def with_command_line(spec: ClusterSpec, command: tuple[str, ...]) -> ClusterSpec:
    """Apply what follows `--`: arguments starting with a dash extend the program the spec runs
    (the built-in trainer, or the spec file's command); anything else replaces the program."""
    import dataclasses

    if not command:
        return spec
    if not command[0].startswith("-"):
        return dataclasses.replace(spec, command=command)
    if spec.command is not None:
        return dataclasses.replace(spec, command=spec.command + command)
    return dataclasses.replace(spec, trainer_args=spec.trainer_args + command)


# ---------------------------------------------------------------------------
# mgpu tf-config

TF_CONFIG_HELP = """Print one task's TF_CONFIG, for use under another scheduler.

\b
Examples:
  mgpu tf-config --workers h1:2222,h2:2222 --task-index 1
  eval "$(mgpu tf-config --workers h1:2222,h2:2222 --task-index 0 --format env)"
  mgpu tf-config --spec cluster.yaml --task-type chief --task-index 0
"""


@cli.command("tf-config", help=TF_CONFIG_HELP)
@cluster_options
@click.option("--task-type", type=click.Choice(ROLES), default=WORKER, show_default=True)
@click.option("--task-index", type=click.IntRange(min=0), required=True)
@click.option("--format", "fmt", type=click.Choice(["json", "env"]), default="json", show_default=True,
              help="json, or env: an `export TF_CONFIG='...'` line for a shell.")
def tf_config_command(task_type: str, task_index: int, fmt: str, **opts) -> None:
    from launcher.plan import render_tf_config, select_task

    plans = make_plans(read_spec(opts), run_id="tf-config", count_gpus=False)
    click.echo(render_tf_config(select_task(plans, task_type, task_index), fmt))


# ---------------------------------------------------------------------------
# mgpu check

CHECK_HELP = """Check every host of the cluster, in parallel, without starting anything.

\b
For each host: SSH login (host key, user, key), the task's program and Python,
whether TensorFlow imports (and the built-in trainer, when tasks run it) with
the same TensorFlow version as this machine, whether the tasks' ports are
free, and how many GPUs nvidia-smi lists. One table row per host.
`mgpu launch` runs the same checks on remote hosts first (--no-check skips them).

\b
Examples:
  mgpu check --workers h1:2222,h2:2222
  mgpu check --spec cluster.yaml --known-hosts ./known_hosts
  mgpu check --workers h1,h2 -- python train.py

Exit codes: 0 every host is ready, 1 a host failed, 2 bad input.
"""


@cli.command("check", help=CHECK_HELP)
@cluster_options
@click.option("--workdir", metavar="DIR", help="Working directory of every task.")
@click.option("--python", metavar="PATH", help="Interpreter that runs the built-in trainer.")
@ssh_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def check_command(**opts) -> None:
    import dataclasses

    from launcher.check import check_hosts, local_tensorflow_version, raise_for_failures, render_table

    command = opts.pop("command")
    spec = with_command_line(read_spec(opts), command)
    spec = dataclasses.replace(spec, workdir=opts["workdir"] or spec.workdir, python=opts["python"] or spec.python)
    plans = make_plans(spec, run_id="check")
    ssh_runner = None
    if any(not plan.local for plan in plans):
        from launcher.launch import make_ssh_runner

        ssh_runner = make_ssh_runner(opts)
    try:
        reports = check_hosts(plans, ssh_runner, local_tensorflow_version())
    finally:
        if ssh_runner is not None:
            ssh_runner.close()
    click.echo(render_table(reports))
    raise_for_failures(reports)


# ---------------------------------------------------------------------------
# mgpu train

TRAIN_HELP = """Run the built-in trainer (what each task runs by default).

All arguments go to the trainer; `mgpu train --help` lists them.
"""


@cli.command("train", help=TRAIN_HELP, add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def train_command(args: tuple[str, ...]) -> None:
    from launcher.trainer import main as trainer_main

    sys.exit(trainer_main(list(args)))


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv)
