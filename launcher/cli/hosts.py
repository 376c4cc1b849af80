"""`mgpu hosts`: the quarantine of this user (hosts runs left out for a fault of the host), listed
and lifted; and --quarantine, the option of the commands that read it."""

from __future__ import annotations

import json
import time

import click

from launcher.cli.main import cli
from launcher.cli.params import DURATION, ParsedParam
from launcher.config.quarantine import DEFAULT_DURATION, parse_duration
from launcher.supervise.console_text import console_safe

quarantine_option = click.option(
    "--quarantine", type=DURATION, default=None, metavar="DURATION",
    help="Remember a host this run leaves out for a fault of the host (lost, unreachable, the same failure "
         "twice, a failed --health-check) for this long, in this user's quarantine file; a later launch or "
         "check warns about it and gives its tasks to a spare host (--spare-hosts) where one is given. "
         "E.g. 24h, 90m, 2d; 0: neither read nor write the quarantine (`mgpu hosts` lists it); spec: `quarantine:`. "
         "[default: 24h]")


def quarantine_of(opts: dict, spec) -> float:
    """--quarantine, else the spec's `quarantine:`, else the default."""
    for given in (opts.get("quarantine"), spec.quarantine):
        if given is not None:
            return given
    return DEFAULT_DURATION


health_check_option = click.option(
    "--health-check", metavar="COMMAND",
    help="A shell command every host runs in the workdir before it runs tasks: before the start, on a spare "
         "before it takes over, and on the hosts of a failed attempt before the restart, after the built-in GPU "
         "checks where nvidia-smi exists. A host whose check fails is left out (a spare host takes its tasks) "
         "and quarantined, named with the check's last lines (spec: `health_check:`).")

def _timeout(text: str) -> float:
    seconds = parse_duration(text)
    if seconds <= 0:
        raise ValueError("give a time above 0, e.g. 300 or 10m")
    return seconds


health_check_timeout_option = click.option(
    "--health-check-timeout", type=ParsedParam("duration", _timeout), default=None, metavar="DURATION",
    help="How long a host's --health-check may take before the host counts as failing it, e.g. 300, 10m "
         "(spec: `health_check_timeout:`). [default: 300 s]")


def _warn(text: str) -> None:
    click.echo(f"mgpu: warning: {console_safe(text)}", err=True)


HOSTS_HELP = """List the hosts this user's runs left out for a fault of the host, which later
launches and checks avoid until each one's expiry (see --quarantine); --clear HOST lifts one.

\b
The quarantine file is $XDG_STATE_HOME/mgpu/quarantine.json (or
~/.local/state/mgpu/quarantine.json).

\b
Examples:
  mgpu hosts
  mgpu hosts --clear gpu07
  mgpu hosts --json
"""


@cli.command("hosts", help=HOSTS_HELP)
@click.option("--clear", "clear", multiple=True, metavar="HOST", help="Lift the quarantine of HOST (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the quarantine as JSON.")
def hosts_command(clear: tuple[str, ...], as_json: bool) -> None:
    from launcher.host.quarantine_file import QuarantineFile

    keeper = QuarantineFile(warn=_warn)
    if clear:
        held = {entry.host for entry in keeper.entries()}
        if not keeper.clear(clear):
            raise click.exceptions.Exit(1)
        for host in clear:
            said = "quarantine lifted" if host in held else "was not quarantined"
            click.echo(f"mgpu: {console_safe(host)}: {said}", err=True)
        return
    entries = sorted(keeper.entries(), key=lambda entry: entry.until)
    if as_json:
        click.echo(json.dumps({"file": keeper.path, "hosts": [entry.to_dict() for entry in entries]}, indent=2))
        return
    if not entries:
        click.echo(f"no quarantined hosts ({console_safe(keeper.path)})")
        return
    rows = [("HOST", "CAUSE", "UNTIL", "RUN", "DETAIL")] + [
        (entry.host, entry.cause, time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.until)), entry.run_id,
         entry.detail) for entry in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(console_safe(cell).ljust(width) for cell, width in zip(row, widths)) + "  "
                   + console_safe(row[4]))
