"""Two hosts in network namespaces of our own, each with its own sshd; the launcher stays in the
root namespace and reaches them over a veth and a bridge. Nothing leaves these namespaces."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import psutil
import pytest

import lab_mgpu
from launcher.plan.planner import TaskPlan
from launcher.backends.ssh.backend import SshBackend
from launcher.config.spec import SshSettings
from launching import REPO, wait_for
from netns_hosts import NETNS_PREFIX, ip, remove_namespace, remove_stale_namespaces, require_namespaces
from ssh_helpers import PYTHON, require_tools, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns]


def test_proxy_jump_reaches_a_host_only_the_jump_host_sees(netns):
    lab, known, config, _ = netns
    from launcher.backends.ssh.options import SshOptions

    runner = SshBackend(SshOptions(known_hosts=str(known), ssh_config=str(config), connect_timeout=5))
    plan = TaskPlan("worker", 0, "inner", 2222, False, SshSettings(), ("true",), {"TF_CONFIG": "{}"}, None, False)
    try:
        code, out, _ = runner.run(plan, "readlink /proc/self/ns/net", 10)
    finally:
        runner.close()
    assert code == 0 and out.decode().strip() == f"net:[{lab.net_inode('h1')}]"


TRAINER_ARGS = ["--model", "small", "--dataset", "synthetic", "--threads", "1", "--train-steps", "5", "--log-every", "1"]
# A user's TensorFlow program that does nothing but join the cluster.
STRATEGY_ONLY = "import tensorflow as tf; tf.distribute.MultiWorkerMirroredStrategy(); print('joined')"


# Listens on its own TF_CONFIG address and dials every other one (retrying until that one
# listens); ends once it has reached them all and been reached by them all.
PEERS = r"""
import json, os, socket, time
tf = json.loads(os.environ["TF_CONFIG"])
me = tf["cluster"][tf["task"]["type"]][tf["task"]["index"]]
others = [address for addresses in tf["cluster"].values() for address in addresses if address != me]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(me.rsplit(":", 1)[1])))
server.listen()
server.settimeout(60)
for address in others:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    print("reached", address, flush=True)
for _ in others:
    server.accept()[0].close()
print("reached by all", flush=True)
"""


def test_hosts_known_only_as_ssh_config_aliases_reach_each_other(netns, tmp_path):
    lab, *_ = netns
    run_id = unique_run_id("alias")
    done = lab_mgpu.run(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "gpu-h1:2222,gpu-h2:2222",
                        "--no-check", "--workdir", str(tmp_path), "--run-id", run_id, "--", PYTHON, "-c", PEERS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    expected = [f"{lab.hosts['h1']}:2222", f"{lab.hosts['h2']}:2222"]
    assert [p["tf_config"]["cluster"]["worker"] for p in record["plans"]] == [expected, expected]
    for index, other in ((0, "h2"), (1, "h1")):
        log = (tmp_path / "mgpu-runs" / run_id / f"worker-{index}.log").read_text().splitlines()
        assert log == [f"reached {lab.hosts[other]}:2222", "reached by all"], log
    assert done.stdout.splitlines()[-1].startswith("[mgpu] done: 2 tasks succeeded in ")
    assert not run_processes(run_id)


def test_an_alias_kept_as_written_is_named_as_unresolvable(netns, tmp_path):
    done = lab_mgpu.run(tmp_path, "check", *lab_mgpu.ssh_files(netns), "--workers", "gpu-h1:2222,gpu-h2:2222",
                        "--keep-host-names", "--", PYTHON, "-c", "pass", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "mgpu: error: tasks cannot reach each other:"
    assert "worker:0 on gpu-h1 cannot resolve gpu-h2 (worker:1 at gpu-h2:2222)" in lines
    assert "worker:1 on gpu-h2 cannot resolve gpu-h1 (worker:0 at gpu-h1:2222)" in lines
    assert lines[-1].startswith("hint: ") and "--keep-host-names" in lines[-1]


@pytest.fixture
def port_blocked_on_h2(netns):
    """h2 drops every packet that arrives from the network for its ports 2222 to 2224, as a firewall
    would."""
    require_tools("iptables")
    lab, *_ = netns
    rule = ["INPUT", "-i", "eth0", "-p", "tcp", "--dport", "2222:2224", "-j", "DROP"]
    namespace = ["ip", "netns", "exec", lab.namespaces["h2"], "iptables"]
    subprocess.run([*namespace, "-A", *rule], check=True)
    try:
        yield lab
    finally:
        subprocess.run([*namespace, "-D", *rule], check=True)


@pytest.mark.slow
def test_a_firewalled_port_is_named_by_the_check_before_anything_starts_and_by_the_trainer_without_it(
        port_blocked_on_h2, netns, tmp_path):
    """Three launches side by side, on ports of their own, so that what they wait for (the check's
    dropped connection, TensorFlow's giving up) is waited once: the check names the port before
    anything starts, for the built-in trainer and for a user's program alike; without the check the
    trainer is named by its error."""
    lab = port_blocked_on_h2
    launches = {}
    # Without the check TensorFlow gives up on the first collective (about 30 s after the start on a
    # quiet machine). The start timeout is far longer, so that a slow TensorFlow start on a loaded
    # machine is never what ends the run.
    without_check = ("--no-check", "--start-timeout", "300", "--grace-period", "2")
    for port, program, options in ((2222, TRAINER_ARGS, ()), (2223, [PYTHON, "-c", STRATEGY_ONLY], ()),
                                   (2224, TRAINER_ARGS, without_check)):
        run_id = unique_run_id("blocked")
        launches[port] = run_id, lab_mgpu.start(
            tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", f"h1:{port},h2:{port}", "--python", PYTHON,
            "--workdir", str(tmp_path), "--run-id", run_id, "--env", f"PYTHONPATH={REPO}", *options, "--", *program,
            text=True)
    try:
        for port, (run_id, proc) in launches.items():
            stdout, stderr = proc.communicate(timeout=400)
            assert proc.returncode == 1, stdout[-3000:] + stderr[-3000:]
            if port == 2224:  # without the check: the error names the address it could not reach, the hint why
                report = stderr[stderr.index("mgpu: error: "):]
                assert report.startswith("mgpu: error: worker:0 on h1 exited with code 1"), report
                assert f"{lab.hosts['h2']}:2224" in report, report
                assert "\nhint: a task could not reach another" in report, report
            else:
                # TF_CONFIG has h2's address from the ssh config; h2 reaches h1, and itself, fine.
                broken = [line for line in stderr.splitlines() if " cannot connect to " in line]
                assert broken == [f"worker:0 on h1 cannot connect to worker:1 at {lab.hosts['h2']}:{port}: "
                                  "timed out after 5 s"], stderr
                assert not (tmp_path / "mgpu-runs" / run_id / "worker-0.log").exists()  # nothing started
            assert not run_processes(run_id)
    finally:
        for _, proc in launches.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_a_remote_program_is_started_once_it_listens(netns, tmp_path):
    # No ready line: the join reporter on each host reports the listening port. The programs listen
    # until the test has seen mgpu count them ready (they share this machine's filesystem).
    release = tmp_path / "release"
    listen = ("import os, socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              f"s.bind(('0.0.0.0', 2222)); s.listen(); print('listening', flush=True)\n"
              f"for _ in range(1200):\n    if os.path.exists({str(release)!r}): break\n    time.sleep(0.1)")
    run_id = unique_run_id("listen")
    launcher = lab_mgpu.start(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "h1:2222,h2:2222",
                              "--run-id", run_id, "--no-check", "--start-timeout", "60", "--", PYTHON, "-c", listen,
                              stderr=subprocess.STDOUT, text=True)
    output = []
    try:
        for line in launcher.stdout:  # ends when mgpu does
            output.append(line)
            if "all 2 tasks ready after" in line:
                release.touch()
        assert launcher.wait(60) == 0, "".join(output)[-3000:]
    finally:
        release.touch()
        launcher.kill()
        launcher.wait(10)
    assert any("all 2 tasks ready after" in line for line in output)
    record = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())
    assert all(task["ready_at"] for task in record["attempts"][0]["tasks"].values())
    assert "MGPU_REMOTE_LISTENING" not in "".join(output)
    assert not run_processes(run_id)


def test_a_remote_program_that_never_listens_hits_the_watchdog(netns, tmp_path):
    run_id = unique_run_id("silent")
    # The start timeout counts from when both tasks run, and what they printed is read to its end
    # before the report is written. Their line is the shell's first act: no interpreter's start
    # up (seconds for Python on a loaded machine) comes before it.
    program = "echo 'reading the data set'; exec sleep 60"
    done = lab_mgpu.run(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "h1:2222,h2:2222", "--run-id",
                        run_id, "--no-check", "--start-timeout", "3", "--grace-period", "1", "--", "sh", "-c", program,
                        timeout=120)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert "mgpu: error: start timeout: worker:0, worker:1 not ready after 3 s" in lines
    for index, host in enumerate(("h1", "h2")):
        log = f"mgpu-runs/{run_id}/worker-{index}.log"  # under the launcher's working directory
        assert f"worker:{index} on {host} never listened on port 2222 (log: {log})" in lines
    assert lines.count("    reading the data set") == 2
    assert not run_processes(run_id)


PUBLIC_ADDRESS = "1.2.3.4"  # a global unicast address, only ever used inside the namespace below


@pytest.fixture
def public_netns():
    """A namespace of our own whose only interface, lo, also has a public address: this
    machine as a host on the internet, with nothing routed anywhere."""
    require_namespaces()
    remove_stale_namespaces()
    name = f"{NETNS_PREFIX}{os.getpid()}-pub"
    try:
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{PUBLIC_ADDRESS}/32", "dev", "lo")
        yield name
    finally:
        remove_namespace(name)


def test_a_local_task_on_a_public_address_is_warned_about(public_netns, tmp_path):
    env = lab_mgpu.env()
    for extra, warned in (([], True), (["--allow-public"], False)):
        run_id = unique_run_id("public")
        done = subprocess.run(
            ["ip", "netns", "exec", public_netns, PYTHON, "-m", "launcher", "launch", "--workers",
             f"{PUBLIC_ADDRESS}:2222", "--run-id", run_id, *extra, "--", PYTHON, "-c", "print('ran here')"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "ran here" in done.stdout  # a local task: SSH to that address would have been refused
        warnings = [line for line in done.stderr.splitlines() if line.startswith("mgpu: warning:")]
        if warned:
            assert len(warnings) == 1, done.stderr
            assert f"worker:0 serves TensorFlow on {PUBLIC_ADDRESS} port 2222, a public address" in warnings[0]
        else:
            assert warnings == [], done.stderr
        assert not run_processes(run_id)


def test_a_detached_run_on_two_hosts_is_followed_and_stopped_from_other_shells(netns, tmp_path):
    _, known, config, _ = netns
    run_id = unique_run_id("detached")
    program = "import time; print('waiting', flush=True)\nfor _ in range(1200): time.sleep(0.1)"
    env = lab_mgpu.env()
    launch = [PYTHON, "-m", "launcher", "launch", "--detach", "--ssh-config", str(config), "--known-hosts", str(known),
              "--workers", "h1:2222,h2:2222", "--run-id", run_id, "--no-check", "--grace-period", "2", "--",
              PYTHON, "-c", program]
    # From a shell of its own session, which ends once the launch has returned.
    shell = subprocess.run(["bash", "-c", shlex.join(launch) + "; echo shell-exit=$?"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120, start_new_session=True, stdin=subprocess.DEVNULL)
    assert "shell-exit=0" in shell.stdout and f"run {run_id} goes on detached" in shell.stdout, shell.stderr
    console = tmp_path / "mgpu-runs" / run_id / "console.log"
    try:
        wait_for(lambda: console.read_text().count("] waiting") == 2, 60, lambda: console.read_text())
        status = subprocess.run(
            [PYTHON, "-m", "launcher", "status", run_id, "--json"], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=60)
        assert json.loads(status.stdout)["state"] == "running"
        follow = subprocess.Popen([PYTHON, "-m", "launcher", "logs", run_id, "-f"], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stop = subprocess.run([PYTHON, "-m", "launcher", "stop", run_id], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert stop.returncode == 0 and f"run {run_id} interrupted (exit 143)" in stop.stdout, stop.stderr
        text, _ = follow.communicate(timeout=60)
        assert follow.returncode == 143 and "[worker:1] waiting" in text, text
    finally:
        pid = json.loads((tmp_path / "mgpu-runs" / run_id / "run.json").read_text())["supervisor_pid"]
        if psutil.pid_exists(pid):
            os.kill(pid, 9)
    wait_for(lambda: not run_processes(run_id), 30, lambda: str(run_processes(run_id)))
