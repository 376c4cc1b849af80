"""The `mgpu` group and its entry point. Errors are caught once, here, and become exit codes."""

from __future__ import annotations

import sys
import traceback

import click

from launcher import __version__
from launcher.cli.streams import discard_stdout, open_standard_streams, stdout_gone
from launcher.errors import EXIT_INTERRUPTED, MgpuError, OutputClosed
from launcher.supervise.console_text import console_safe

GIVEN_ARGS = "mgpu.given_args"  # the command line's arguments as given, in the root context's meta (run.json's)
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class MgpuGroup(click.Group):
    """The top-level group: every error becomes one line on stderr and an exit code."""

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        self.root_context: click.Context | None = None
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
            if debug_flag(self.root_context):
                traceback.print_exc()
            if isinstance(exc, OutputClosed):
                discard_stdout()
            # An error may carry what a host or a file said: its lines are shown, nothing else of it runs.
            text = "\n".join(console_safe(line) for line in str(exc).split("\n"))
            _say(f"mgpu: error: {text}")
            code = exc.exit_code
        except Exception as exc:  # a bug: one line, and the traceback on request
            if debug_flag(self.root_context):
                traceback.print_exc()
            click.echo(f"mgpu: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                       err=True)
            code = 1
        sys.exit(code)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not stdout_gone():  # another pipe's: a bug
                raise
            raise OutputClosed("standard output was closed (its reader ended) before mgpu finished writing") from None

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        given = tuple(args)  # before parsing takes them
        # Kept so that errors raised by a command can still be shown with its --debug.
        self.root_context = super().make_context(info_name, args, parent, **extra)
        self.root_context.meta[GIVEN_ARGS] = given
        return self.root_context


def _say(line: str) -> None:
    """One line on stderr, if anyone reads it still."""
    try:
        click.echo(line, err=True)
    except OSError:
        pass


def debug_flag(ctx: click.Context | None) -> bool:
    """The group's --debug (or MGPU_DEBUG): the one place it is read, for errors and commands alike."""
    return bool(ctx is not None and ctx.find_root().params.get("debug"))


@click.group(cls=MgpuGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="mgpu")
@click.option("--debug", is_flag=True, help="Show the traceback of errors, and the SSH library's log.")
def cli(debug: bool) -> None:
    """Launch and supervise multi-worker training, locally, over SSH, under Slurm or on Kubernetes.

    \b
    Examples:
      mgpu launch --local 2                          # a 2-worker cluster on this machine
      mgpu launch --workers h1:2222,h2:2222 -- python train.py
      mgpu launch --spec cluster.yaml --dry-run      # show what would run, start nothing
      mgpu launch --local 2 --detach                 # no terminal needed; then: mgpu logs last -f
      mgpu tf-config --workers h1:2222,h2:2222 --task-index 1 --format env
      mgpu k8s --workers 4 --image my/train:1 -- python train.py | kubectl apply -f -

    Every option can also be set from the environment as MGPU_<COMMAND>_<OPTION>,
    for example MGPU_LAUNCH_WORKERS=h1:2222,h2:2222.
    """
    # Read through debug_flag(): errors show tracebacks, the commands pass it on in their options.


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    open_standard_streams()
    cli.main(args=argv)
