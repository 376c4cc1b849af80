import json

import pytest
from click.testing import CliRunner

from launcher.cli import cli


class Result:
    def __init__(self, result):
        self.exit_code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def mgpu():
    """Run `mgpu ARGS...` in-process through click's CliRunner, with stdout and stderr apart."""

    def run(*args, env=None):
        return Result(CliRunner().invoke(cli, list(args), env=env))

    return run
