import json
import os

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


@pytest.fixture
def gpus_on_path(tmp_path):
    """A PATH whose nvidia-smi lists `count` GPUs, as `nvidia-smi -L` does."""

    def make(count):
        bin_dir = tmp_path / f"bin{count}"
        bin_dir.mkdir()
        listing = "".join(f"echo 'GPU {i}: NVIDIA A100 (UUID: GPU-{i:04d})'\n" for i in range(count))
        script = bin_dir / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + listing)
        script.chmod(0o755)
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    return make
