"""`mgpu check` and a launch's checks over SSH: the table, the login options that win, one error line for a bad host."""

from __future__ import annotations

import importlib.metadata
import signal
import socket
import sys

import pytest

import lab_mgpu
from launcher.host.ports import pick_free_ports
from launching import wait_for
from ssh_helpers import PYTHON, run_processes, silent_listener, unique_run_id
from ssh_tasks import launch_args, ssh_args

pytestmark = pytest.mark.ssh


def test_unknown_host_key_refuses_the_launch(ssh_lab, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(ssh_lab.a.known_hosts_line())  # sshd-b is unknown
    for check in ([], ["--no-check"]):  # refused by the check, or by the start of worker:1 after worker:0's
        run_id = unique_run_id("unknown-key" + "".join(check))
        args = launch_args(ssh_lab, run_id, *check, "--env", "MODE_0=hang")
        args[args.index(str(ssh_lab.known_hosts))] = str(known)
        proc = lab_mgpu.start(tmp_path, *args)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1
        last = err.decode().strip().splitlines()[-1]
        assert last.startswith("mgpu: error: ") and ssh_lab.b.fingerprint() in last
        assert f"[127.0.0.1]:{ssh_lab.b.port}" in last and "Traceback" not in err.decode()
        wait_for(lambda: not run_processes(run_id), 10)
    assert known.read_text() == ssh_lab.a.known_hosts_line()


def test_launch_checks_hosts_first(ssh_lab, tmp_path):
    run_id = unique_run_id("checked")
    args = launch_args(ssh_lab, run_id, "--python", "/nonexistent/python3")
    args = args[: args.index("--")]  # the built-in trainer, with a Python that is not there
    proc = lab_mgpu.start(tmp_path, *args)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1
    text = err.decode()
    assert "/nonexistent/python3 not found" in text and "sshd-a" in text and "sshd-b" in text
    assert not (tmp_path / "mgpu-runs" / run_id).exists()


def test_check_table(ssh_lab, tmp_path):
    """The table of `mgpu check` for a program of the user's: the hosts read TensorFlow's version from
    its package metadata (the built-in trainer and --legacy-keras import it: see the test below)."""
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    free_port = pick_free_ports(1)[0]
    try:
        proc = lab_mgpu.start(tmp_path, "check", "--workers", f"sshd-a:{free_port},sshd-b:{busy_port}",
                              *ssh_args(ssh_lab), "--", PYTHON, "train.py")
        out, err = proc.communicate(timeout=180)
    finally:
        busy.close()
    assert proc.returncode == 1, err.decode()
    header, row_a, row_b = out.decode().strip().splitlines()
    assert header.split() == ["HOST", "TASKS", "SSH", "PYTHON", "TENSORFLOW", "PORTS", "GPUS", "RESULT"]
    tf_version = importlib.metadata.version("tensorflow")
    python_version = "%d.%d.%d" % sys.version_info[:3]
    assert row_a.split() == ["sshd-a", "worker:0", "ok", python_version, tf_version, str(free_port), "free", "-", "ok"]
    assert row_b.split()[:5] == ["sshd-b", "worker:1", "ok", python_version, tf_version]
    assert row_b.endswith(f"port {busy_port} in use")
    assert err.decode().strip().splitlines()[-1] == f"mgpu: error: check failed on sshd-b: port {busy_port} in use"


def test_check_with_legacy_keras_probes_tf_keras_on_remote_hosts(ssh_lab, tmp_path):
    """One host: every host runs the same probe, and each imports TensorFlow and tf_keras (some
    CPU-seconds a host)."""
    (port,) = pick_free_ports(1)
    proc = lab_mgpu.start(tmp_path, "check", "--workers", f"sshd-a:{port}", *ssh_args(ssh_lab),
                          "--legacy-keras", "--", PYTHON, "train.py")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()
    header, row = out.decode().strip().splitlines()
    assert header.split()[4:6] == ["TENSORFLOW", "TF_KERAS"]
    assert row.split()[4:6] == [importlib.metadata.version("tensorflow"), importlib.metadata.version("tf-keras")]


def test_check_reports_unreachable_hosts(ssh_lab, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(ssh_lab.ssh_config.read_text() + "Host nowhere\n  HostName 127.0.0.1\n  Port 1\n")
    port_a, port_b = pick_free_ports(2)
    proc = lab_mgpu.start(tmp_path, "check", "--workers", f"sshd-a:{port_a},nowhere:{port_b}", "--ssh-config",
                          str(config), "--known-hosts", str(ssh_lab.known_hosts), "--", PYTHON, "train.py")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1
    rows = {line.split()[0]: line for line in out.decode().strip().splitlines()[1:]}
    assert rows["sshd-a"].endswith("ok")
    assert "failed" in rows["nowhere"] and "refused" in rows["nowhere"]
    assert "nowhere" in err.decode().strip().splitlines()[-1]


def silent_host_config(ssh_lab, tmp_path, port: int):
    """ssh config with `silent`, a host whose server accepts connections and never answers."""
    config = tmp_path / "ssh_config"
    config.write_text(ssh_lab.ssh_config.read_text() + f"Host silent\n  HostName 127.0.0.1\n  Port {port}\n")
    return config


@pytest.mark.parametrize("command", [["check"], ["launch", "--run-id", unique_run_id("silent")],
                                     ["launch", "--no-check", "--run-id", unique_run_id("silent")]])
def test_a_host_that_never_answers_is_one_error_line(ssh_lab, tmp_path, command):
    with silent_listener() as listener:
        config = silent_host_config(ssh_lab, tmp_path, listener.port)
        proc = lab_mgpu.start(tmp_path, *command, "--workers", "silent:2222", "--ssh-config", str(config),
                              "--known-hosts", str(ssh_lab.known_hosts), "--connect-timeout", "2", "--", PYTHON, "-c",
                              "pass")
        out, err = proc.communicate(timeout=60)
        assert listener.accepted  # it did connect: this is a silent server, not a refused port
    assert proc.returncode == 1
    assert err.decode().splitlines() == ["mgpu: error: silent ([127.0.0.1]:%d): no SSH banner within 2 s" % listener.port]


@pytest.mark.parametrize("command", ["check", "launch"])
def test_sigint_during_the_checks_returns_at_once(ssh_lab, tmp_path, command):
    """Ctrl-C while a host's check waits out a long connect timeout does not wait with it."""
    with silent_listener() as listener:
        config = silent_host_config(ssh_lab, tmp_path, listener.port)
        proc = lab_mgpu.start(tmp_path, command, "--workers", "sshd-a:2222,silent:2222", "--ssh-config", str(config),
                              "--known-hosts", str(ssh_lab.known_hosts), "--connect-timeout", "600", "--", PYTHON,
                              "train.py")
        try:
            wait_for(lambda: listener.accepted, 60)  # the check is waiting for the banner
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)  # long before the 600 s connect timeout, however busy the machine
        finally:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err.decode()
    assert err.decode().strip().splitlines()[-1] == "mgpu: interrupted"


def test_bad_proxy_jump_is_a_usage_error(ssh_lab, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(ssh_lab.ssh_config.read_text()
                      + f"Host behind\n  HostName 127.0.0.1\n  Port {ssh_lab.b.port}\n  ProxyJump bastion:notaport\n")
    proc = lab_mgpu.start(tmp_path, "check", "--workers", "behind:2222", "--ssh-config", str(config), "--known-hosts",
                          str(ssh_lab.known_hosts))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.decode().splitlines() == ["mgpu: error: behind: bad ProxyJump 'bastion:notaport': port 'notaport' is not a number"]


def test_missing_identity_file_in_the_spec_is_one_error_line(ssh_lab, tmp_path):
    spec = tmp_path / "cluster.yaml"
    missing = tmp_path / "no_such_key"
    spec.write_text(f"cluster:\n  worker: [sshd-a:2222]\nhosts:\n  sshd-a: {{identity_file: {missing}}}\n")
    for command in (["check"], ["launch", "--no-check"]):
        proc = lab_mgpu.start(tmp_path, *command, "--spec", str(spec), *ssh_args(ssh_lab), "--", PYTHON, "-c", "pass")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert err.decode().splitlines() == [f"mgpu: error: sshd-a: identity file {missing} not found"]


def test_ssh_user_port_and_identity_options_win_over_the_ssh_config(ssh_lab, tmp_path):
    """The config names a port where nothing listens, a user who cannot log in and a key no server
    accepts: the command line's values are the ones used."""
    closed, task_port = pick_free_ports(2)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host over\n  HostName 127.0.0.1\n  Port {closed}\n  User nobody\n"
                      f"  IdentityFile {ssh_lab.wrong_key}\n")
    run_id = unique_run_id("options-win")
    program = "import os; print('logged in on', os.environ['SSH_CONNECTION'].split()[3], 'as', os.environ['USER'])"
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"over:{task_port}", "--ssh-config", str(config),
                          "--known-hosts", str(ssh_lab.known_hosts), "--connect-timeout", "5", "--ssh-user",
                          ssh_lab.user, "--ssh-port", str(ssh_lab.a.port), "--identity", str(ssh_lab.client_key),
                          "--run-id", run_id, "--no-check", "--", PYTHON, "-c", program)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert f"logged in on {ssh_lab.a.port} as {ssh_lab.user}" in out.decode()
