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


def test_the_health_checks_time_is_the_specs_or_the_command_lines(tmp_path):
    """A check that outlives `health_check_timeout:` (here 1 s, of the spec) fails its host; the
    command line's --health-check-timeout wins over the spec's; 0 is bad input."""
    spec = tmp_path / "spec.yaml"
    spec.write_text('cluster:\n  worker: ["127.0.0.1:2222"]\nhealth_check: "sleep 5"\nhealth_check_timeout: 1\n')
    done = run_mgpu("launch", "--spec", str(spec), "--log-dir", str(tmp_path), "--",
                    "sh", "-c", f"touch {tmp_path}/ran", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].endswith(": the health check did not finish within 1 s"), done.stderr
    spec.write_text('cluster:\n  worker: ["127.0.0.1:2222"]\nhealth_check: "sleep 1.5"\nhealth_check_timeout: 1\n')
    longer = run_mgpu("launch", "--spec", str(spec), "--health-check-timeout", "30", "--log-dir", str(tmp_path), "--",
                      "sh", "-c", f"touch {tmp_path}/ran", cwd=tmp_path)
    assert longer.returncode == 0, longer.stderr
    assert (tmp_path / "ran").exists()
    bad = run_mgpu("launch", "--local", "1", "--health-check", "true", "--health-check-timeout", "0", "--dry-run")
    assert bad.returncode == 2 and "give a time above 0" in bad.stderr, bad.stderr
