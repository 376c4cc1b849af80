"""The commands: launch, check and train (tf-config: tf_config.py; k8s: k8s.py; the runs: runs.py)."""

from __future__ import annotations

import sys

import click

from launcher.cli import params
from launcher.cli.hosts import health_check_option, health_check_timeout_option, quarantine_of, quarantine_option
from launcher.cli.main import cli
from launcher.cli.options import (
    check_text, cluster_options, exit_codes_of, host_naming, hosts_request, launch_options_from,
    min_hosts_option, no_check_option, rejoin_interval_option, spare_hosts_option, ssh_options, ssh_options_from,
    task_settings, with_min_hosts, with_spare_hosts,
)
from launcher.intake.quarantine import avoiding_quarantined
from launcher.intake.load import (
    SlurmScope, make_plans, new_run_id, read_spec, spare_plans as spare_check_plans, with_command_line, with_task_settings,
)
from launcher.config.sync import DEFAULT_SYNC_MAX_BYTES
from launcher.config.spec import MAX_GPUS_PER_TASK, MAX_LOCAL_TASKS, MAX_THREADS_PER_TASK
from launcher.errors import UsageError
from launcher.backends.base import DEFAULT_GRACE_PERIOD
from launcher.supervise.options import DEFAULT_LOG_DIR, DEFAULT_SLOW_WINDOW, DEFAULT_STALL_TIMEOUT

legacy_keras_option = click.option(
    "--legacy-keras", is_flag=True,
    help="Run Keras programs with tf_keras (Keras 2): sets TF_USE_LEGACY_KERAS=1 in every task. "
         "Keras 3's model.fit does not run under MultiWorkerMirroredStrategy; tf_keras's does. "
         "Every host needs tf-keras of its TensorFlow's series (checked before the launch).")

LAUNCH_HELP = """Start one process per task, locally or over SSH, and supervise them.

\b
Hosts come from exactly one of --workers, --hosts, --hostfile, --spec, --local
or --slurm.
With no COMMAND, every task runs the built-in trainer (`mgpu train`) with this
launcher's Python (remote hosts: --python, default python3). Arguments after
`--` that start with a dash are passed to the trainer; anything else is a
command that runs in every task with TF_CONFIG set.

\b
Examples:
  mgpu launch --local 2
  mgpu launch --local 2 --chief --evaluator -- --train-steps 500 --model-dir /tmp/m
  mgpu launch --local 2 --chief --ps 1 -- python3 ps_train.py
  mgpu launch --workers h1:2222,h2:2222 -- python train.py --epochs 3
  mgpu launch --hostfile hosts.txt --port 23456 --dry-run --json
  mgpu launch --spec cluster.yaml --max-restarts 2
  salloc -N 2 --ntasks-per-node 2 mgpu launch --slurm -- --train-steps 500

With --detach, the checks run here, then the run goes on by itself and
`mgpu launch` returns (exit 0) with the commands that follow it: mgpu status,
logs, attach and stop. A launch whose terminal closes (SIGHUP) goes on the same
way, its console in console.log.

Exit codes: 0 success, 1 a task failed, 2 bad input, 130/143 interrupted by SIGINT/SIGTERM.
"""


@cli.command("launch", help=LAUNCH_HELP)
@cluster_options(no_value_with="--local or --slurm")
@click.option("--local", type=params.Count(min=1, max=MAX_LOCAL_TASKS), metavar="N",
              help="Simulate a cluster of N workers as processes on this machine (ports chosen free).")
@click.option("--ps", type=params.Count(min=1, max=MAX_LOCAL_TASKS), metavar="N",
              help="With --local: N parameter servers too (ParameterServerStrategy; needs --chief).")
@click.option("--slurm", is_flag=True,
              help="Inside a Slurm allocation (salloc, sbatch): one task per Slurm task, started as one srun step.")
@click.option("--dry-run", is_flag=True, help="Print every task's command, env and TF_CONFIG; start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print the plan as JSON only.")
@click.option("--show-secrets", is_flag=True,
              help="Show the values of --env, --env-file and --forward-env in the dry run and run.json "
                   "(hidden as *** by default).")
@click.option("--run-id", type=params.RUN_ID, help="Name of this run (default: the time and 32 random hex digits); tags every task.")
@click.option("--log-dir", type=click.Path(file_okay=False), default=DEFAULT_LOG_DIR, show_default=True,
              help="Where each run's logs and run.json go, under a folder named by the run id.")
@click.option("--detach", is_flag=True,
              help="Check and start the run, then leave it to a supervisor of its own, without a terminal "
                   "(its console goes to console.log in the run's folder), and return; follow it with "
                   "mgpu status, logs, attach and stop. Not with --slurm: submit with sbatch instead.")
@click.option("--timestamps", is_flag=True, help="Prefix console lines with the time.")
@click.option("--show", type=params.TASK_SELECTORS, metavar="TYPE[:INDEX],...",
              help="Show only these tasks on the console (logs still get everything), e.g. chief,worker:0.")
@click.option("--show-tf-logs", is_flag=True,
              help="Show TensorFlow's C++ INFO and WARNING records and its start-up notices (cuInit, oneDNN, "
                   "CPU features) on the console; the task logs always have them.")
@click.option("--grace-period", type=params.Seconds(0), default=DEFAULT_GRACE_PERIOD, show_default=True,
              metavar="SECONDS", help="Time between TERM and KILL when stopping tasks (remote ones too, when their "
                                      "SSH session ends).")
@click.option("--start-timeout", type=params.Seconds(0.1), default=120.0, show_default=True, metavar="SECONDS",
              help="Stop the cluster if a task has not started by then: printed the ready line (the "
                   "built-in trainer) or, for other programs, listened on its port or connected to the "
                   "coordinator's (the first member's), as JAX and PyTorch processes other than 0 do.")
@click.option("--stall-timeout", type=params.Seconds(0), default=None, metavar="SECONDS",
              help=f"Stop the run (with every task's Python stack) when no training task has printed anything "
                   f"or used CPU for this long once all are ready; 0: never. [default: "
                   f"{DEFAULT_STALL_TIMEOUT:g}, or the spec's stall_timeout]")
@click.option("--slow-window", type=params.Seconds(0), default=DEFAULT_SLOW_WINDOW, show_default=True,
              metavar="SECONDS",
              help="Name the training task the others wait for once it has been clearly busier than them "
                   "over this long (see Slow hosts in the docs); 0: never.")
@click.option("--tensorboard", type=click.Path(file_okay=False), metavar="DIR",
              help="Write TensorBoard event files of the run under DIR/mgpu/ while it goes: goodput and the time "
                   "lost by cause, restarts and their causes, hosts in use, busy shares, steps per second "
                   "(needs tensorboardX; spec: `tensorboard:`).")
@click.option("--max-restarts", type=params.Count(min=0), default=0, show_default=True,
              help="Restart the whole cluster after a failure, up to N times (a program that fails the same way "
                   "twice in a row without progress is not restarted again).")
@click.option("--exit-codes", type=params.EXIT_CODES, metavar="CODE=ACTION,...",
              help="What a task's exit code means: restart (counted in --max-restarts), restart-free (not "
                   "counted), fail (stop now, no restart) or leave-out-host (its host's tasks go to a spare), "
                   "e.g. 3=fail,75=restart-free; over the spec's exit_codes. [default: 42=restart-free]")
@click.option("--notify", metavar="COMMAND",
              help="A shell command run on this machine at each event of the run (started, attempt failed, host "
                   "left out, stalled, ended), with the event as JSON on its standard input and in MGPU_EVENT.")
@click.option("--notify-url", type=params.NOTIFY_URL, metavar="URL", envvar="MGPU_NOTIFY_URL", show_envvar=True,
              help="POST each event's JSON to URL (it has a Slack-compatible 'text' field): a Slack, Mattermost "
                   "or other incoming webhook. A webhook's URL is its password: give it in MGPU_NOTIFY_URL, "
                   "where other users' ps does not show it.")
@click.option("--worker-restarts", type=params.Count(min=0), default=0, show_default=True, metavar="N",
              help="Parameter-server training (a --ps task): restart a worker that fails in place, up to N times in "
                   "all, the chief and the ps tasks going on (TensorFlow's ClusterCoordinator takes it back). Not with "
                   "--slurm.")
@spare_hosts_option
@min_hosts_option
@rejoin_interval_option
@quarantine_option
@health_check_option
@health_check_timeout_option
@click.option("--threads-per-task", type=params.Count(min=1, max=MAX_THREADS_PER_TASK), metavar="K",
              help="TF intra-op and inter-op threads, and OMP_NUM_THREADS, for every task.")
@click.option("--gpus-per-task", type=params.Count(min=0, max=MAX_GPUS_PER_TASK), metavar="K",
              help="GPUs per task, as CUDA_VISIBLE_DEVICES (default: split this host's GPUs evenly; none: empty).")
@click.option("--env", "env_pairs", type=params.ENV_ASSIGNMENT, multiple=True, metavar="NAME=VALUE",
              help="Set an environment variable in every task (repeatable).")
@click.option("--env-file", type=params.InputFile(), metavar="FILE",
              help="Set environment variables from a file of NAME=VALUE lines.")
@click.option("--forward-env", type=params.ENV_NAME_OR_PREFIX, multiple=True, metavar="NAME|PREFIX*",
              help="Pass this variable of the launcher's environment on to every task (repeatable); "
                   "PREFIX* passes every variable whose name starts with PREFIX, e.g. 'NCCL_*'.")
@click.option("--workdir", metavar="DIR", help="Working directory of every task (default: the launcher's, or the remote login dir).")
@click.option("--python", metavar="PATH", help="Interpreter that runs the built-in trainer.")
@click.option("--sync", metavar="DIR",
              help="Copy DIR to every remote host before the tasks start (only changed files; in a git work "
                   "tree the files git would commit, minus .mgpuignore patterns) and run the tasks in the copy: "
                   "--workdir, or ~/mgpu-sync/NAME. Tasks on this machine run in DIR itself.")
@click.option("--sync-max-size", type=params.BYTE_SIZE, default=None, metavar="SIZE",
              help="Refuse to --sync more than SIZE (e.g. 500M, 4G). [default: 1G]")
@click.option("--setup", metavar="COMMAND",
              help="A shell command run once on every host, in the workdir, before the tasks start (e.g. "
                   "'pip install -r requirements.txt'), with --env and --env-file; a failure stops the launch.")
@click.option("--setup-timeout", type=params.Seconds(0.1), default=None, metavar="SECONDS",
              help="Stop the launch if --setup has not finished on a host by then. [default: 1800]")
@legacy_keras_option
@ssh_options
@no_check_option
@click.option("--leave-out-slow", is_flag=True,
              help="A host the speed probe finds far below the others (under 0.7 of the median) gives its "
                   "tasks to a spare host (--spare-hosts) before the start; without a spare it is only "
                   "warned about.")
@click.option("--allow-public", is_flag=True, help="Do not warn about workers on public addresses.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch_command(**opts) -> int | None:
    if opts["as_json"] and not opts["dry_run"]:
        raise UsageError("--json goes with --dry-run")
    if opts["detach"] and opts["dry_run"]:
        raise UsageError("--detach starts a run; --dry-run starts nothing: give one of them")
    if opts["leave_out_slow"] and (opts["no_check"] or opts["slurm"]):
        raise UsageError("--leave-out-slow needs the speed probe of the pre-launch checks: not with "
                         + ("--no-check" if opts["no_check"] else "--slurm"))
    if opts["health_check"] and opts["slurm"]:
        raise UsageError("--health-check runs on SSH hosts and this machine: not with --slurm (Slurm checks "
                         "its nodes itself: see HealthCheckProgram in slurm.conf)")
    if opts["detach"] and opts["slurm"]:
        raise UsageError("--detach does not go with --slurm: the allocation ends with the shell that holds it; "
                         "submit the launch with sbatch instead (it runs without a terminal)")
    command = opts.pop("command")
    check_text(opts, command)
    slurm = SlurmScope.ALLOCATION if opts["slurm"] else None
    hosts = hosts_request(opts, opts["local"], slurm)
    spec = with_spare_hosts(with_task_settings(with_command_line(read_spec(hosts), command), task_settings(opts)), opts)
    opts["quarantine"] = quarantine_of(opts, spec)
    spec = avoiding_quarantined(spec, opts["quarantine"], slurm=slurm is not None)
    spec = with_min_hosts(spec, opts)
    if spec.command is None and any(task.role == "ps" for task in spec.tasks):
        raise UsageError("the built-in trainer uses MultiWorkerMirroredStrategy, which has no parameter servers: "
                         "give your ParameterServerStrategy program after --")
    run_id = opts["run_id"] or new_run_id()
    plans = make_plans(spec, run_id, host_naming(opts), slurm=slurm is not None, max_restarts=opts["max_restarts"],
                       sync_max_bytes=opts["sync_max_size"] or DEFAULT_SYNC_MAX_BYTES)

    if opts["dry_run"]:
        from launcher.plan.render import iter_plan_json, iter_plan_text

        render = iter_plan_json if opts["as_json"] else iter_plan_text
        out = sys.stdout
        for piece in render(plans, opts["show_secrets"]):  # streamed: the text grows as tasks^2
            out.write(piece)
        if not opts["as_json"]:
            out.write(f"exit codes: {exit_codes_of(opts, spec).said()}\n")
        if spec.spares and not opts["as_json"]:
            out.write(f"spare hosts: {', '.join(spec.spares)} (each takes the tasks of a host left out)\n")
        if spec.min_hosts and not opts["as_json"]:
            out.write(f"min hosts: {spec.min_hosts} (with no spare left, the run goes on without a host left out "
                      f"while {spec.min_hosts} or more remain)\n")
        out.flush()
        return

    import dataclasses

    from launcher.launch import launch

    def replan(changed):
        return make_plans(changed, run_id, host_naming(opts), slurm=slurm is not None,
                          max_restarts=opts["max_restarts"], sync_max_bytes=opts["sync_max_size"] or DEFAULT_SYNC_MAX_BYTES)

    return launch(plans, dataclasses.replace(launch_options_from(opts, run_id, spec), spec=spec, replan=replan,
                                             argv=tuple(sys.argv[1:])))


# ---------------------------------------------------------------------------
# mgpu check

CHECK_HELP = """Check every host of the cluster, in parallel, without starting anything.

\b
For each host: SSH login (host key, user, key), the task's program and Python,
whether TensorFlow imports (and the built-in trainer, when tasks run it) with
the same TensorFlow version as this machine, whether the tasks' ports are
free, and how many GPUs nvidia-smi lists. With --legacy-keras, also whether
tf_keras imports and matches TensorFlow's series (with the pip command that
fixes it). One table row per host. Then, on every host at once, each task's
port is listened on and every task connects to every other task's TF_CONFIG
address; each pair that cannot is named. Last, a speed probe times every host
at once (a numpy matrix product on one core, the first GPU's where there is
one, a transfer to the next host of a ring): a host under 0.7 of the median
is named in the SPEED column and a warning (not a failure). `mgpu launch` runs
the same checks on remote hosts first, and with --legacy-keras on this machine
too, reading TensorFlow's and tf_keras's versions without importing them (the
tasks import them at once); the reachability test runs for every launch, local
tasks included, and the speed probe for a launch on more than one host
(--no-check skips them all). A host of this user's quarantine (`mgpu hosts`)
is warned about, and a spare host checked in its place where one is given.
With --health-check, the launch's health check runs on every host too (the
built-in GPU checks, then the command): a HEALTH column, and a host that fails
it fails the check, named with the command's last lines.

\b
Examples:
  mgpu check --workers h1:2222,h2:2222
  mgpu check --spec cluster.yaml --known-hosts ./known_hosts
  mgpu check --workers h1,h2 -- python train.py
  mgpu check --workers h1,h2 --legacy-keras -- python train.py
  mgpu check --workers h1,h2,h3 --json -- python train.py
  mgpu check --workers h1,h2 --health-check 'test -r /data/train.tfrecord'

Exit codes: 0 every host is ready, 1 a host failed, 2 bad input.
"""


@cli.command("check", help=CHECK_HELP)
@spare_hosts_option
@quarantine_option
@health_check_option
@health_check_timeout_option
@cluster_options(no_value_with=None)
@click.option("--workdir", metavar="DIR", help="Working directory of every task.")
@click.option("--python", metavar="PATH", help="Interpreter that runs the built-in trainer.")
@legacy_keras_option
@ssh_options
@click.option("--json", "as_json", is_flag=True,
              help="Print the table as JSON (one object per host, with the speed probe's figures) on stdout.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def check_command(**opts) -> None:
    from launcher.errors import CheckFailed
    from launcher.preflight.check import check_hosts_and_reach, local_tensorflow_version, raise_for_failures
    from launcher.preflight.reach import HINT as REACH_HINT, describe_interfaces

    command = opts.pop("command")
    check_text(opts, command)
    spec = with_spare_hosts(with_task_settings(with_command_line(read_spec(hosts_request(opts)), command),
                                               task_settings(opts)), opts)
    spec = avoiding_quarantined(spec, quarantine_of(opts, spec))
    plans = make_plans(spec, run_id="check", naming=host_naming(opts))
    spare_plans = spare_check_plans(spec, "check", host_naming(opts))
    ssh_backend = None
    if any(not plan.local for plan in [*plans, *spare_plans]):
        from launcher.fleet.backends import make_ssh_backend

        ssh_backend = make_ssh_backend(ssh_options_from(opts))
    try:
        # One session per host for the three; what the reachability test found counts only where
        # every host passed its check (the test needs their Python and ports), and the speed
        # probe's figures only where every pair connected too (its ring needs them).
        reports, reachability, speeds = check_hosts_and_reach([*plans, *spare_plans], plans, ssh_backend,
                                                              local_tensorflow_version(), speed=True,
                                                              import_tensorflow=True)
        if health_check := opts["health_check"] or spec.health_check:
            from launcher.preflight.check_health import add_health_checks

            add_health_checks(reports, [*plans, *spare_plans], health_check, ssh_backend,
                              opts["health_check_timeout"] or spec.health_check_timeout)
        if not all(r.ok for r in reports) or reachability.problems:
            speeds = []
    finally:
        if ssh_backend is not None:
            ssh_backend.close()
    _show_check(reports, speeds, reachability.problems, opts["as_json"])
    raise_for_failures(reports)
    if reachability.problems:
        raise CheckFailed("tasks cannot reach each other:\n" + "\n".join(reachability.problems) + "\n" + REACH_HINT)
    click.echo("mgpu: every task reached every other task's TF_CONFIG address", err=True)  # stdout: the table
    click.echo(f"mgpu: {describe_interfaces(plans, reachability.interfaces)}", err=True)


def _show_check(reports, speeds, unreachable, as_json: bool) -> None:
    """The table (or its rows as JSON) with each host's speed figures, and a warning line for each
    host far below the others."""
    import json

    from launcher.preflight.check import py_spy_notes, render_table
    from launcher.preflight.check_json import document
    from launcher.preflight.speed import by_slow_host, describe, slow_hosts, warning_lines

    slow = slow_hosts(speeds)
    named = by_slow_host(slow)
    by_name = {speed.host: speed for speed in speeds}
    for report in reports:
        if report.host in by_name:
            report.speed = describe(by_name[report.host]) + (" SLOW" if report.host in named else "")
    if as_json:
        click.echo(json.dumps(document(reports, speeds, unreachable), indent=2))
    else:
        click.echo(render_table(reports))
    for note in py_spy_notes(reports):
        click.echo(f"mgpu: {note}", err=True)
    for speed in speeds:
        for problem in speed.problems:
            click.echo(f"mgpu: the speed probe on {speed.host}: {problem}", err=True)
    for line in warning_lines(slow):
        click.echo(f"mgpu: warning: {line}", err=True)


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


