"""The one place errors become lines (cli/main.py): an error's text may carry what a host, a file or
a server said, and reaches the terminal with its control characters escaped, its lines kept."""

import click
import pytest

from launcher.cli.main import MgpuGroup
from launcher.errors import CheckFailed


@click.group(cls=MgpuGroup)
def group() -> None:
    pass


@group.command()
def fails() -> None:
    raise CheckFailed("h1 said: \x1b]0;owned\x07\x1b[2J\rforged\nsecond line \u202eevil")


def test_an_errors_control_characters_are_escaped_and_its_lines_kept(capsys):
    with pytest.raises(SystemExit) as exited:
        group.main(["fails"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err == "mgpu: error: h1 said: \\x1b]0;owned\\x07\\x1b[2J\\x0dforged\nsecond line \\u202eevil\n"
