"""--health-check on this machine: a check that passes lets the run start; one that fails ends the
launch before any task starts, naming its last lines (this machine is never left out)."""

import os

from launching import mgpu_env, run_mgpu

# An nvidia-smi that answers as a host whose GPU 1 asks for a reset does (the built-in checks' query).
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=index,gpu_recovery_action) printf 'index, gpu_recovery_action\\n0, None\\n1, Reset\\n' ;;
  --query-gpu=*) echo "Field is not a valid field to query." >&2; exit 2 ;;
esac
"""


def test_a_failed_health_check_here_ends_the_launch_naming_its_last_lines(tmp_path):
    done = run_mgpu("launch", "--local", "1", "--log-dir", str(tmp_path), "--health-check",
                    "echo started; echo 'GPU 0: fell off the bus' >&2; exit 3", "--",
                    "sh", "-c", f"touch {tmp_path}/ran", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-2].startswith("mgpu: error: host(s) failed the health check (") and \
        lines[-2].endswith(" is this machine, which is never left out):"), lines
    assert lines[-1].endswith(": the health check exited with code 3: GPU 0: fell off the bus"), lines
    assert not (tmp_path / "ran").exists()
    passed = run_mgpu("launch", "--local", "1", "--log-dir", str(tmp_path), "--health-check", "exit 0", "--",
                      "sh", "-c", f"touch {tmp_path}/ran", cwd=tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert (tmp_path / "ran").exists()


def test_the_built_in_gpu_checks_run_where_nvidia_smi_is(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    os.chmod(bin_dir / "nvidia-smi", 0o755)
    env = mgpu_env()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    done = run_mgpu("launch", "--local", "1", "--log-dir", str(tmp_path), "--health-check", "true", "--", "true",
                    cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(": GPU 1: the driver asks for a recovery action: Reset"), done.stderr
