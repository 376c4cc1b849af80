"""The stall's folder (stall_bundle.py), written into a real run folder."""

import os

from launcher.supervise import stall_bundle
from launcher.supervise.rundir import RunDir


def test_the_readme_names_the_attempt_as_the_console_counts_it_and_the_folder_as_run_json_does(tmp_path):
    run = tmp_path / "20260102-030405-ab"
    run.mkdir()
    run_dir = RunDir(run, os.open(run, os.O_RDONLY | os.O_DIRECTORY))
    try:
        stall_bundle.write(run_dir, 1, "===== worker:1 on h2 =====\n", "stacks-1.txt")
    finally:
        run_dir.close()
    readme = (run / "stall-1" / "README").read_text()
    assert readme.startswith("What mgpu collected when attempt 2 of run 20260102-030405-ab stalled")
    assert "the console's \"attempt 2 failed: stalled\"" in readme
    assert "counts from 0 (attempts[1])" in readme
    assert (run / "stacks-1.txt").read_text() == (run / "stall-1" / "stacks.txt").read_text()
