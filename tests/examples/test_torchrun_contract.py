"""A torch program sees the whole of torchrun's contract under `mgpu launch`: torch takes it for a
torchrun process, each attempt counts as a restart, and torch's own `@record` writes the error file
mgpu reads."""

import json
import secrets
import sys
import textwrap

import pytest
from needs import installed_version

from launcher import error_file
from launcher.host import proctree
from launching import run_mgpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAM = """
    import os
    import sys
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    def load(shard):
        raise FileNotFoundError(f"shard {shard} is missing")

    @record
    def main():
        names = ("GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
        print("launched by torchrun:", dist.is_torchelastic_launched(), *(os.environ[n] for n in names), flush=True)
        if os.environ["RANK"] == "1":
            if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                sys.exit(3)
            load(7)

    main()
"""


def test_torch_sees_torchruns_contract_and_records_its_error_where_mgpu_reads(tmp_path):
    installed_version("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PROGRAM))
    run_id = f"tr-{secrets.token_hex(4)}"
    result = run_mgpu("launch", "--local", "2", "--max-restarts", "1", "--log-dir", str(tmp_path / "runs"),
                      "--run-id", run_id, "--", sys.executable, str(script), cwd=tmp_path, timeout=240)
    out = result.stdout + result.stderr
    assert not proctree.tagged_processes(run_id)
    # worker:1 prints before it fails; worker:0 may be stopped first.
    assert "[worker:1] launched by torchrun: True 0 1 0 1" in out, out[-3000:]
    assert "[worker:1] launched by torchrun: True 0 1 1 1" in out, out[-3000:]
    assert result.returncode != 0
    assert "  FileNotFoundError: shard 7 is missing" in out, out[-3000:]
    assert f"  at {script}:8 in load: raise FileNotFoundError(" in out, out[-3000:]
    # From torch's error file, not from the output: the file holds torch's document.
    [run_dir] = (tmp_path / "runs").glob(f"*{run_id}*")
    written = json.loads((run_dir / "worker-1.attempt1.error.json").read_text())
    assert written["message"]["message"] == "FileNotFoundError: shard 7 is missing"
    error = error_file.parse((run_dir / "worker-1.attempt1.error.json").read_bytes())
    assert error is not None and error.frame.startswith(f"{script}:8 in load")
