"""Executing a plan: check the run can start, pick a runner per task, check remote hosts, then supervise."""

from __future__ import annotations

import pathlib
from typing import Sequence

import click

from launcher.plan import TaskPlan


def launch(plans: Sequence[TaskPlan], run_id: str, opts: dict) -> None:
    from launcher.runners.local import LocalRunner
    from launcher.supervisor import SuperviseOptions, check_run_dir, supervise

    options = SuperviseOptions(
        run_id=run_id,
        log_dir=pathlib.Path(opts["log_dir"]),
        grace_period=opts["grace_period"],
        start_timeout=opts["start_timeout"],
        max_restarts=opts["max_restarts"],
        timestamps=opts["timestamps"],
        show=opts["show"],
    )
    check_run_dir(options)  # a run id or log dir that cannot be used fails before any connection

    local_runner = LocalRunner()
    runners = [local_runner]
    remote = [plan for plan in plans if not plan.local]
    ssh_runner = None
    if remote:
        ssh_runner = _start_ssh(plans, remote, opts)
        runners.append(ssh_runner)
    else:
        _warn_about_exposure(plans, None, opts)

    def runner_for(plan: TaskPlan):
        return local_runner if plan.local else ssh_runner

    try:
        supervise(plans, runner_for, options)
    finally:
        for runner in runners:
            runner.close()


def _warn_about_exposure(plans: Sequence[TaskPlan], resolve, opts: dict) -> None:
    """Warn about every task, local ones too: TensorFlow's server listens on all interfaces."""
    from launcher.exposure import exposure_warnings

    if not opts["allow_public"]:
        for warning in exposure_warnings(plans, resolve):
            click.echo(f"mgpu: warning: {warning}", err=True)


def _start_ssh(plans: Sequence[TaskPlan], remote: Sequence[TaskPlan], opts: dict):
    """Warn about exposed workers, check the remote hosts, and return a connected SSH runner."""
    from launcher.check import run_checks
    runner = make_ssh_runner(opts)
    try:
        # Remote ssh-config aliases are judged by the address they really reach.
        _warn_about_exposure(plans, runner.resolved_address, opts)
        if not opts["no_check"]:
            run_checks(remote, runner)
    except BaseException:
        runner.close()
        raise
    return runner


def make_ssh_runner(opts: dict):
    """An SSH runner for the command's options; with --debug, paramiko's own log is shown too."""
    from launcher.runners import ssh
    from launcher.runners.ssh_options import ssh_options_from

    context = click.get_current_context(silent=True)
    if context is not None and context.find_root().params.get("debug"):
        ssh.enable_debug_logging()
    return ssh.SshRunner(ssh_options_from(opts))
