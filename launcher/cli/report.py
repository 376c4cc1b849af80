"""`mgpu report`: a run's story as one HTML page, and its timeline as a Chrome trace."""

from __future__ import annotations

import pathlib

import click

from launcher.cli.main import cli
from launcher.cli.runs import RUN_HELP, log_dir_option
from launcher.report import files
from launcher.supervise import runs
from launcher.supervise.console_text import console_safe

REPORT_HELP = f"""A run's story as one self-contained HTML page: the command and hosts, a
timeline (a row per task, a bar per attempt), the failed attempts and their causes, hosts left
out and who took their place, each task's busy share, progress and goodput with the time lost,
the host checks, links to each task's log. It fetches nothing: it opens from disk or as an email
attachment. The timeline is also written as a Chrome trace (JSON), which Perfetto
(ui.perfetto.dev) and chrome://tracing open.

{RUN_HELP} Without -o the page and the trace are report.html and trace.json
in the run's folder; with -o FILE the trace is beside FILE (FILE's name with .trace.json).
A running run's report shows it as far as it has gone.

\b
Examples:
  mgpu report last
  mgpu report 20260102-030405 -o run.html

Exit codes: 0; 2 when RUN is not a run of yours or the page cannot be written.
"""


@cli.command("report", help=REPORT_HELP)
@click.argument("run_name", metavar="RUN")
@log_dir_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=pathlib.Path), metavar="FILE",
              help="Write the page here (default: report.html in the run's folder).")
def report_command(run_name: str, log_dir: pathlib.Path, output: pathlib.Path | None) -> None:
    run = runs.find(log_dir, run_name)
    page, trace = files.write_report(run, output)
    click.echo(console_safe(f"mgpu: report of run {run.run_id}: {page} (its timeline for Perfetto: {trace})"))
