"""`mgpu launch` and `mgpu check` as subprocesses, with tasks on two loopback sshd servers."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import pathlib
import signal
import socket
import sys
import time
from typing import Iterator

import psutil
import pytest

import lab_mgpu
from launcher.host import proctree
from launcher.host.ports import pick_free_ports
from launching import wait_for
from ssh_helpers import PYTHON, run_processes, silent_listener, start_sshd, unique_run_id

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


def ssh_args(ssh_lab) -> list[str]:
    return ["--ssh-config", str(ssh_lab.ssh_config), "--known-hosts", str(ssh_lab.known_hosts),
            "--connect-timeout", "5"]


def wait_for_both_tasks_hanging(proc, run_id: str) -> None:
    """Until both remote tasks print "hanging" (at most 60 s) and each has its child running."""
    hanging = 0
    deadline = time.monotonic() + 60
    while hanging < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()
        hanging += b"hanging" in line
    assert hanging == 2
    wait_for(lambda: len(run_processes(run_id)) >= 4, 10)  # two tasks, each with a child


def launch_args(ssh_lab, run_id: str, *extra: str) -> list[str]:
    port_a, port_b = pick_free_ports(2)
    return ["launch", "--workers", f"sshd-a:{port_a},sshd-b:{port_b}", *ssh_args(ssh_lab), "--run-id", run_id,
            "--grace-period", "3", *extra, "--", PYTHON, "-c", TASK_PROGRAM]


def test_two_task_cluster_over_ssh(ssh_lab, tmp_path):
    run_id = unique_run_id("two-ok")
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, run_id, "--no-check"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "task 0 0" in text and "task 1 1" in text
    assert "warning" not in err.decode()  # loopback addresses are not exposed
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert record["status"] == "succeeded"
    logs = sorted(p.name for p in (tmp_path / "mgpu-runs" / run_id).glob("*.log"))
    assert "worker-0.log" in logs and "worker-1.log" in logs
    assert not run_processes(run_id)


def test_a_failing_task_stops_the_remote_cluster(ssh_lab, tmp_path):
    env_args = ["--env", "MODE_0=fail", "--env", "MODE_1=hang"]
    run_id = unique_run_id("fail-fast")
    started = time.monotonic()
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, run_id, "--no-check", *env_args))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    assert "mgpu: error: worker:0 on sshd-a" in err.decode()
    assert time.monotonic() - started < 60
    wait_for(lambda: not run_processes(run_id), 10)


def test_sigint_stops_the_remote_cluster(ssh_lab, tmp_path):
    env_args = ["--env", "MODE_0=hang", "--env", "MODE_1=hang"]
    run_id = unique_run_id("sigint")
    proc = lab_mgpu.start(tmp_path, *launch_args(ssh_lab, run_id, "--no-check", *env_args))
    try:
        wait_for_both_tasks_hanging(proc, run_id)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        wait_for(lambda: not run_processes(run_id), 10)
    finally:
        proc.kill()
        proc.wait(10)


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


def test_a_remote_tasks_stderr_reaches_its_log_byte_exact(ssh_lab, tmp_path):
    """Text that looks like the remote wrapper's reports is the task's own, and stays in its log."""
    run_id = unique_run_id("byte-exact")
    (port,) = pick_free_ports(1)
    text = b"abcMGPU_REMOTE_LISTENING\ndef\nMGPU_REMOTE_PGID 1\nlistening\nconnected\n\x1emgpu-0123456789abcdef usage 1 2 3\n"
    program = f"import sys; sys.stderr.buffer.write({text!r})"
    proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port}", *ssh_args(ssh_lab), "--run-id", run_id,
                          "--no-check", "--", PYTHON, "-c", program)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert (tmp_path / "mgpu-runs" / run_id / "worker-0.log").read_bytes() == text


def test_a_sigkilled_launcher_of_an_ssh_only_run_is_recorded_as_died(ssh_lab, tmp_path):
    """kill -9 of mgpu: its reaper marks run.json launcher-died, and the remote tasks end once
    their sessions close."""
    run_id = unique_run_id("launcher-died")
    proc = lab_mgpu.start(tmp_path,
                          *launch_args(ssh_lab, run_id, "--no-check", "--env", "MODE_0=hang",                                                 "--env", "MODE_1=hang"))
    record = tmp_path / "mgpu-runs" / run_id / "run.json"

    def status():
        try:
            return json.loads(record.read_text())["status"]
        except (OSError, ValueError):
            return None

    try:
        wait_for_both_tasks_hanging(proc, run_id)
        assert status() == "running"
        proc.kill()
        proc.wait(10)
        wait_for(lambda: status() == "launcher-died", 30, lambda: status())
        wait_for(lambda: not run_processes(run_id), 30)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


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


# The old launch's task: it ignores SIGTERM and stays until the test creates RELEASE. The remote
# hosts are this machine, where the new launcher's check for live processes of the run id would
# see it; a task on another machine is out of that check's sight, and so this one is made: it
# execs itself without mgpu's tags in its environment, keeping its pid, its group and its session.
OLD_TASK = r"""
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
env = {k: v for k, v in os.environ.items() if not k.startswith("MGPU_")}
os.execve(sys.executable, [sys.executable, "-c", '''
import os, pathlib, sys, time
print("old-up", os.getpgid(0), flush=True)
deadline = time.monotonic() + 120
while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
''', sys.argv[1]], env)
"""

NEW_TASK = r"""
import pathlib, sys, time
print("new-up", flush=True)
deadline = time.monotonic() + 120
while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
sys.exit(0 if pathlib.Path(sys.argv[1]).exists() else 3)
"""


def read_until(proc, text: bytes) -> bytes:
    """The first line of mgpu's stdout with `text` in it (at most 500 lines)."""
    for _ in range(500):
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode()
        if text in line:
            return line
    raise AssertionError(f"no {text!r} in mgpu's output")


def guards_of(pgid: int) -> list[psutil.Process]:
    """The hang-up guards of the task whose group is `pgid`: its host's agent, its parent (with
    --no-host-agent, the shell guard of its session, in its group)."""
    found = []
    for p in proctree.every_process():
        try:
            if os.getpgid(p.pid) == pgid and "mgpu-guard" in p.cmdline():
                found.append(p)
            elif p.pid == psutil.Process(pgid).ppid() and "mgpu-host-agent" in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def test_a_run_id_used_again_after_its_launcher_was_killed_keeps_the_new_tasks(ssh_lab, tmp_path):
    """kill -9 of a launcher of an SSH run, then a new launch with the same run id: the old task's
    hang-up guard waits out its grace period for the old task (which ignores SIGTERM), then kills
    what carries its tags; the new launch's task, with the same run id, attempt, type and index,
    is not among them."""
    run_id = unique_run_id("reused")
    release, done = tmp_path / "release", tmp_path / "done"
    port_old, port_new = pick_free_ports(2)
    common = [*ssh_args(ssh_lab), "--run-id", run_id, "--no-check"]
    old = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port_old}", *common, "--log-dir", "old",
                         "--grace-period", "30", "--", PYTHON, "-c", OLD_TASK, str(release))
    new = None
    try:
        old_pgid = int(read_until(old, b"old-up").split()[-1])
        old_guards = guards_of(old_pgid)
        assert old_guards
        old.kill()
        old.wait(10)
        new = lab_mgpu.start(tmp_path, "launch", "--workers", f"sshd-a:{port_new}", *common, "--log-dir", "new", "--",
                             PYTHON, "-c", NEW_TASK, str(done))
        read_until(new, b"new-up")
        release.touch()  # the old task goes; its guard ends (having killed what it found with its tags)
        wait_for(lambda: not [guard for guard in old_guards if guard.is_running()], 60, "the old guard to end")
        done.touch()
        new.wait(60)
        assert new.returncode == 0, new.stdout.read().decode() + new.stderr.read().decode()
    finally:
        release.touch()
        done.touch()
        for proc in (old, new):
            if proc is not None:
                proc.kill()
                proc.wait(10)
                proc.stdout.close()
                proc.stderr.close()


@contextlib.contextmanager
def forced_host(ssh_lab, tmp_path, name: str, force_command: str) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    """One more loopback sshd, host `name`, whose sessions run `force_command` (sshd's ForceCommand,
    which may run the session's command from $SSH_ORIGINAL_COMMAND): (known_hosts, ssh config)
    that name it beside sshd-a and sshd-b."""
    server = start_sshd(tmp_path, name, ssh_lab.authorized_keys, extra=f"ForceCommand {force_command}\n")
    try:
        known = tmp_path / "known_hosts"
        known.write_text(ssh_lab.known_hosts.read_text() + server.known_hosts_line())
        config = tmp_path / "ssh_config"
        config.write_text(ssh_lab.ssh_config.read_text() + f"Host {name}\n  HostName {server.address}\n"
                          f"  Port {server.port}\n  User {ssh_lab.user}\n  IdentityFile {ssh_lab.client_key}\n")
        yield known, config
    finally:
        server.stop()


def test_tasks_on_different_hosts_start_together(ssh_lab, tmp_path):
    """Each start over SSH waits for the host's login shell; the hosts' starts overlap. Here the
    first host's shell (sshd's ForceCommand) waits until the second host's task has written a file:
    started one after another in plan order, the first task would find no file (its shell gives up
    waiting after 30 s, and only then would the second task start)."""
    started = tmp_path / "second-task-started"
    force = (f"i=0; while [ ! -e {started} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
             'eval "$SSH_ORIGINAL_COMMAND"')
    with forced_host(ssh_lab, tmp_path, "waits", force) as (known, config):
        program = ("import os, pathlib, sys; flag = pathlib.Path(sys.argv[1]); index = os.environ['MGPU_TASK_INDEX']\n"
                   "if index == '1': flag.touch()\n"
                   "print('task', index, 'sees the file' if flag.exists() else 'sees no file', flush=True)\n")
        port_a, port_b = pick_free_ports(2)
        proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"waits:{port_a},sshd-b:{port_b}", "--no-check",
                              "--ssh-config", str(config), "--known-hosts", str(known), "--connect-timeout", "5",
                              "--run-id", unique_run_id("together"), "--", PYTHON, "-c", program, str(started))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert "task 0 sees the file" in out.decode(), out.decode() + err.decode()


# What a task sees of its session: every environment variable, where it starts, the signals it
# ignores and blocks (/proc's masks, read by sh: Python ignores two signals of its own at start), and
# whether it leads its session's process group.
SESSION_PROGRAM = r"""
import json, os, sys
print("SESSION " + json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "signals": sys.argv[1],
      "leader": os.getsid(0) == os.getpgid(0)}), flush=True)
"""
SESSION_COMMAND = ["/bin/sh", "-c", 'exec "$0" -c "$1" "$(grep -E "^Sig(Ign|Blk)" /proc/$$/status)"', PYTHON,
                   SESSION_PROGRAM]
# Per launch: the run's tags, its ports, and the SSH connection's own (its source port); the
# interface the checks found (none without them); the session's command, which ForceCommand shows.
_PER_LAUNCH = {"TF_CONFIG", "MGPU_LAUNCH_ID", "MGPU_RUN_ID", "TORCHELASTIC_RUN_ID", "SSH_CLIENT", "SSH_CONNECTION",
               "MASTER_PORT", "MASTER_ADDR", "JAX_COORDINATOR_ADDRESS", "KERAS_DISTRIBUTION_JOB_ADDRESSES",
               "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "SSH_ORIGINAL_COMMAND",
               "TORCH_WORKER_SERVER_SOCKET"}  # named after the run (the flight recorder's socket)


def test_the_checks_session_starts_the_hosts_first_task_as_a_session_of_its_own_would(ssh_lab, tmp_path):
    """The check's SSH session runs the host's first task, so each login runs the user's start-up
    files once (here sshd's ForceCommand counts the sessions, and leaves a line on stderr
    unfinished, as a chatty start-up file may). The task gets what a session of its own gives it
    (without the checks, the host's agent has one), in the login directory and in a --workdir, through
    the host's agent and with --no-host-agent."""
    sessions = tmp_path / "sessions"
    force = f'echo session >> {sessions}; printf "motd, no newline" >&2; eval "$SSH_ORIGINAL_COMMAND"'
    with forced_host(ssh_lab, tmp_path, "counted", force) as (known, config):
        for workdir in ([], ["--workdir", str(tmp_path)]):
            seen = {}
            # --no-host-agent's check session starts the task as the agent does: in the login folder only.
            for checks in ([], ["--no-check"]) + (() if workdir else (["--no-host-agent"],)):
                sessions.write_text("")
                (port,) = pick_free_ports(1)
                proc = lab_mgpu.start(tmp_path, "launch", "--workers", f"counted:{port}", *checks, *workdir,
                                      "--ssh-config", str(config), "--known-hosts", str(known), "--connect-timeout",
                                      "5", "--run-id", unique_run_id("held"), "--", *SESSION_COMMAND)
                out, err = proc.communicate(timeout=120)
                assert proc.returncode == 0, err.decode()
                assert sessions.read_text().count("session") == 1, (checks, sessions.read_text(), err.decode())
                line = next(line for line in out.decode().splitlines() if "SESSION " in line)
                seen[" ".join(checks)] = json.loads(line.split("SESSION ", 1)[1])
            held, own, no_agent = seen[""], seen["--no-check"], seen.get("--no-host-agent", seen[""])
            assert held["env"]["MGPU_TASK_TYPE"] == "worker" and "TF_CPP_MIN_LOG_LEVEL" not in held["env"]
            for name in _PER_LAUNCH:
                held["env"].pop(name, None), own["env"].pop(name, None), no_agent["env"].pop(name, None)
            assert held == own == no_agent
            assert held["cwd"] == (workdir[1] if workdir else os.path.expanduser("~" + ssh_lab.user))
            ignored = int(held["signals"].split("SigIgn:")[1].split()[0], 16)
            assert held["leader"] and not ignored & (1 << signal.SIGPIPE - 1 | 1 << signal.SIGXFSZ - 1)
