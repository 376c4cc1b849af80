"""`mgpu launch` and `mgpu check` as subprocesses, with tasks on two loopback sshd servers."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ssh_helpers import PYTHON, REPO, run_processes, wait_until

pytestmark = pytest.mark.ssh

# Worker 0 and worker 1 behave as the test asks through $MODE_<index>.
TASK_PROGRAM = r"""
import json, os, subprocess, sys, time
index = os.environ["MGPU_TASK_INDEX"]
mode = os.environ.get("MODE_" + index, "ok")
print("task", index, json.loads(os.environ["TF_CONFIG"])["task"]["index"], os.getpgid(0), flush=True)
if mode == "fail":
    sys.exit(1)
if mode == "hang":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("hanging", flush=True)
    time.sleep(300)
"""


def mgpu(ssh_lab, tmp_path, *args, **popen) -> subprocess.Popen:
    env = {**os.environ, "HOME": os.environ["HOME"], "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.Popen(
        [PYTHON, "-m", "launcher", *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen,
    )


def ssh_args(ssh_lab) -> list[str]:
    return ["--ssh-config", str(ssh_lab.ssh_config), "--known-hosts", str(ssh_lab.known_hosts),
            "--connect-timeout", "5"]


def launch_args(ssh_lab, run_id: str, *extra: str) -> list[str]:
    return ["launch", "--workers", "sshd-a:23001,sshd-b:23002", *ssh_args(ssh_lab), "--run-id", run_id,
            "--grace-period", "3", *extra, "--", PYTHON, "-c", TASK_PROGRAM]


def test_two_task_cluster_over_ssh(ssh_lab, tmp_path):
    proc = mgpu(ssh_lab, tmp_path, *launch_args(ssh_lab, "two-ok", "--no-check"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "task 0 0" in text and "task 1 1" in text
    record = json.loads((tmp_path / "mgpu-runs" / "two-ok" / "run.json").read_text())
    assert record["status"] == "succeeded"
    logs = sorted(p.name for p in (tmp_path / "mgpu-runs" / "two-ok").glob("*.log"))
    assert "worker-0.log" in logs and "worker-1.log" in logs
    assert not run_processes("two-ok")


def test_a_failing_task_stops_the_remote_cluster(ssh_lab, tmp_path):
    env_args = ["--env", "MODE_0=fail", "--env", "MODE_1=hang"]
    started = time.monotonic()
    proc = mgpu(ssh_lab, tmp_path, *launch_args(ssh_lab, "fail-fast", "--no-check", *env_args))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    assert "mgpu: error: worker:0 on sshd-a" in err.decode()
    assert time.monotonic() - started < 60
    assert wait_until(lambda: not run_processes("fail-fast"), 10) is True


def test_sigint_stops_the_remote_cluster(ssh_lab, tmp_path):
    env_args = ["--env", "MODE_0=hang", "--env", "MODE_1=hang"]
    proc = mgpu(ssh_lab, tmp_path, *launch_args(ssh_lab, "sigint", "--no-check", *env_args))
    try:
        hanging = 0
        deadline = time.monotonic() + 60
        while hanging < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read().decode()
            hanging += b"hanging" in line
        assert hanging == 2
        assert wait_until(lambda: len(run_processes("sigint")) >= 4, 10)  # two tasks, each with a child
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert wait_until(lambda: not run_processes("sigint"), 10) is True
    finally:
        proc.kill()
        proc.wait(10)


def test_unknown_host_key_refuses_the_launch(ssh_lab, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(ssh_lab.a.known_hosts_line())  # sshd-b is unknown
    for check in ([], ["--no-check"]):  # refused by the check, or by the start of worker:1 after worker:0's
        run_id = "unknown-key" + "".join(check)
        args = launch_args(ssh_lab, run_id, *check, "--env", "MODE_0=hang")
        args[args.index(str(ssh_lab.known_hosts))] = str(known)
        proc = mgpu(ssh_lab, tmp_path, *args)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1
        last = err.decode().strip().splitlines()[-1]
        assert last.startswith("mgpu: error: ") and ssh_lab.b.fingerprint() in last
        assert f"[127.0.0.1]:{ssh_lab.b.port}" in last and "Traceback" not in err.decode()
        assert wait_until(lambda: not run_processes(run_id), 10) is True
    assert known.read_text() == ssh_lab.a.known_hosts_line()


def test_launch_checks_hosts_first(ssh_lab, tmp_path):
    args = launch_args(ssh_lab, "checked", "--python", "/nonexistent/python3")
    args = args[: args.index("--")]  # the built-in trainer, with a Python that is not there
    proc = mgpu(ssh_lab, tmp_path, *args)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1
    text = err.decode()
    assert "/nonexistent/python3 not found" in text and "sshd-a" in text and "sshd-b" in text
    assert not (tmp_path / "mgpu-runs" / "checked").exists()


def test_check_table(ssh_lab, tmp_path):
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    try:
        proc = mgpu(ssh_lab, tmp_path, "check", "--workers", f"sshd-a:23003,sshd-b:{busy_port}", *ssh_args(ssh_lab),
                    "--python", PYTHON)
        out, err = proc.communicate(timeout=180)
    finally:
        busy.close()
    assert proc.returncode == 1, err.decode()
    header, row_a, row_b = out.decode().strip().splitlines()
    assert header.split() == ["HOST", "TASKS", "SSH", "PYTHON", "TENSORFLOW", "PORTS", "GPUS", "RESULT"]
    tf_version = importlib.metadata.version("tensorflow")
    python_version = "%d.%d.%d" % sys.version_info[:3]
    assert row_a.split() == ["sshd-a", "worker:0", "ok", python_version, tf_version, "23003", "free", "-", "ok"]
    assert row_b.split()[:5] == ["sshd-b", "worker:1", "ok", python_version, tf_version]
    assert row_b.endswith(f"port {busy_port} in use")
    assert err.decode().strip().splitlines()[-1] == f"mgpu: error: check failed on sshd-b: port {busy_port} in use"


def test_check_reports_unreachable_hosts(ssh_lab, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(ssh_lab.ssh_config.read_text() + "Host nowhere\n  HostName 127.0.0.1\n  Port 1\n")
    proc = mgpu(ssh_lab, tmp_path, "check", "--workers", "sshd-a:23004,nowhere:23005", "--ssh-config", str(config),
                "--known-hosts", str(ssh_lab.known_hosts), "--python", PYTHON)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1
    rows = {line.split()[0]: line for line in out.decode().strip().splitlines()[1:]}
    assert rows["sshd-a"].endswith("ok")
    assert "failed" in rows["nowhere"] and "refused" in rows["nowhere"]
    assert "nowhere" in err.decode().strip().splitlines()[-1]
