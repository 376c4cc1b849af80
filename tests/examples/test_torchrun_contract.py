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
from launching import mgpu_env, run_mgpu

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


SEES = """
    import os, subprocess
    # What CUDA would number: the GPUs CUDA_VISIBLE_DEVICES names, else every GPU nvidia-smi lists.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible is not None else [
        line.split(":")[0].split()[1] for line in subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                                  text=True).stdout.splitlines()]
    local_rank = int(os.environ["LOCAL_RANK"])
    # torch.cuda.set_device(LOCAL_RANK) as a torchrun-style program calls it; a TF program takes gpus.
    device = gpus[local_rank] if local_rank < len(gpus) else "invalid device ordinal"
    print(f"rank {os.environ['RANK']} sees GPUs {','.join(gpus)}, set_device(LOCAL_RANK) takes {device}")
"""


def test_each_rule_gives_programs_the_gpus_they_expect(tmp_path, gpus_on_path):
    """On a host with two (fake) GPUs: a program of its own finds GPU LOCAL_RANK; with --gpus-per-task
    each task sees only its own, as TensorFlow and JAX want."""
    script = tmp_path / "sees.py"
    script.write_text(textwrap.dedent(SEES))
    env = {**mgpu_env(), **gpus_on_path(2)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for args, expected in ((["--local", "2"], ["rank 0 sees GPUs 0,1, set_device(LOCAL_RANK) takes 0",
                                               "rank 1 sees GPUs 0,1, set_device(LOCAL_RANK) takes 1"]),
                           (["--local", "2", "--gpus-per-task", "1"],
                            ["rank 0 sees GPUs 0, set_device(LOCAL_RANK) takes 0",
                             "rank 1 sees GPUs 1, set_device(LOCAL_RANK) takes invalid device ordinal"])):
        result = run_mgpu("launch", *args, "--log-dir", str(tmp_path / "runs"), "--", sys.executable, str(script),
                          cwd=tmp_path, env=env, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert sorted(line.split("] ", 1)[1] for line in result.stdout.splitlines() if "sees GPUs" in line) == expected
