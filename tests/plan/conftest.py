import os

import pytest


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
