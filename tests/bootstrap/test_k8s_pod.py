"""The pod bootstrap (`python -m launcher.bootstrap.k8s_pod`): what it derives from a pod's
environment, and two "pods" in network namespaces of their own, each resolving the other's name
only as a headless Service would make it, training the built-in trainer to equal weights."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from launcher.config.k8s_env import dns_timeout, pod_env, read_pod
from launcher.errors import UsageError
from launcher.bootstrap.k8s_pod import wait_for_names
from launcher.plan.planner import pod_plan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "backends" / "ssh"))  # the namespace lab

from netns_hosts import Netns  # noqa: E402
from ssh_helpers import REQUIRE, require_tools  # noqa: E402

from launching import REPO


def environ(index, tasks=3, chief=True, **extra):
    return {"JOB_COMPLETION_INDEX": str(index), **pod_env("job", "svc", tasks, chief, 2222), **extra}


def test_each_pod_plans_its_own_task_from_its_index():
    plans = [pod_plan(read_pod(environ(i)), ("python3", "train.py"), sys.executable) for i in range(3)]
    assert [(p.type, p.index) for p in plans] == [("chief", 0), ("worker", 0), ("worker", 1)]
    cluster = {"chief": ["job-0.svc:2222"], "worker": ["job-1.svc:2222", "job-2.svc:2222"]}
    assert [json.loads(p.env["TF_CONFIG"]) for p in plans] == [
        {"cluster": cluster, "task": {"type": t, "index": i}} for t, i in [("chief", 0), ("worker", 0), ("worker", 1)]]
    assert [p.env["RANK"] for p in plans] == ["0", "1", "2"]
    assert {p.env["MASTER_ADDR"] for p in plans} == {"job-0.svc"} and plans[2].env["WORLD_SIZE"] == "3"
    assert plans[1].env["JAX_COORDINATOR_ADDRESS"] == "job-0.svc:2222" and plans[1].env["JAX_PROCESS_ID"] == "1"
    assert plans[0].env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "job-0.svc:2222,job-1.svc:2222,job-2.svc:2222"
    # Kubernetes gave the pod its GPUs: mgpu leaves CUDA_VISIBLE_DEVICES alone.
    assert all("CUDA_VISIBLE_DEVICES" not in p.env for p in plans)
    assert plans[0].argv == ("python3", "train.py")


@pytest.mark.parametrize("change, message", [
    ({"JOB_COMPLETION_INDEX": None}, "not in a pod of an `mgpu k8s` job: JOB_COMPLETION_INDEX is not set"),
    ({"MGPU_K8S_SERVICE": None}, "MGPU_K8S_SERVICE is not set"),
    ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX 3 is out of range: the job has 3 pods (0-2)"),
    ({"MGPU_K8S_TASKS": "²"}, "MGPU_K8S_TASKS '²' is not a number"),
    ({"MGPU_K8S_PORT": "70000"}, "MGPU_K8S_PORT 70000 is not a TCP port"),
    ({"JOB_COMPLETION_INDEX": "\u0663"}, "JOB_COMPLETION_INDEX '\u0663' is not a number"),
    ({"JOB_COMPLETION_INDEX": "1" * 5000}, "JOB_COMPLETION_INDEX '1111111111111111111111111111111111111111'... "
                                          "(5000 characters) has more than 9 digits"),
    ({"MGPU_K8S_TASKS": "200000"}, "MGPU_K8S_TASKS 200000 is not between 1 and 100000"),
    ({"MGPU_K8S_TASKS": "0"}, "MGPU_K8S_TASKS 0 is not between 1 and 100000"),
])
def test_a_pod_environment_that_is_not_whole_is_named(change, message):
    env = environ(0)
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    with pytest.raises(UsageError, match=None) as caught:
        read_pod(env)
    assert message in str(caught.value)


@pytest.mark.parametrize("text, message", [
    ("nan", "is not between 0 and 2592000 seconds (30 days)"),
    ("inf", "is not between 0 and 2592000 seconds (30 days)"),
    ("-1", "is not between 0 and 2592000 seconds (30 days)"),
    ("1e9", "is not between 0 and 2592000 seconds (30 days)"),
    ("\u0663", "is not a number of seconds"),
    ("soon", "is not a number of seconds"),
])
def test_a_dns_timeout_that_is_not_a_finite_number_of_seconds_is_refused(text, message):
    with pytest.raises(UsageError) as caught:
        dns_timeout({"MGPU_K8S_DNS_TIMEOUT": text}, 600)
    assert f"MGPU_K8S_DNS_TIMEOUT {text!r} {message}" == str(caught.value)


def test_a_dns_timeout_is_read_in_seconds():
    assert dns_timeout({}, 600) == 600 and dns_timeout({"MGPU_K8S_DNS_TIMEOUT": "2.5"}, 600) == 2.5
    assert dns_timeout({"MGPU_K8S_DNS_TIMEOUT": "0"}, 600) == 0


def test_a_pod_with_a_dns_timeout_of_nan_says_so_and_exits_2(tmp_path):
    env = {**os.environ, **environ(0), "MGPU_K8S_DNS_TIMEOUT": "nan", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "launcher.bootstrap.k8s_pod", "--", "true"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "mgpu: error: MGPU_K8S_DNS_TIMEOUT 'nan' is not between 0 and 2592000 seconds (30 days)\n"


def test_the_wait_for_names_is_bounded_and_says_once_what_it_waits_for():
    now = [0.0]
    resolvable = {"job-0.svc"}
    heard = []

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 3:
            resolvable.add("job-1.svc")  # the other pod's record appears after 3 s

    left = wait_for_names(["job-0.svc", "job-1.svc", "job-2.svc"], 10, resolvable.__contains__, heard.append,
                          clock=lambda: now[0], sleep=sleep)
    assert left == ["job-2.svc"] and heard == [["job-1.svc", "job-2.svc"]] and now[0] == pytest.approx(10)
    assert wait_for_names(["job-0.svc"], 10, resolvable.__contains__, heard.append, clock=lambda: now[0],
                          sleep=sleep) == []


def test_outside_a_pod_the_bootstrap_says_so_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    done = subprocess.run([sys.executable, "-m", "launcher.bootstrap.k8s_pod", "--", "true"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("mgpu: error: not in a pod")


# -- pods in network namespaces -------------------------------------------------------------


@pytest.fixture(scope="module")
def pods():
    """Two hosts, p0 and p1, each in a namespace of its own with its own hosts file (each test
    writes the hosts files it needs)."""
    require_tools("ip")
    if os.geteuid() != 0:
        if REQUIRE:
            pytest.fail("network namespaces need root and MGPU_REQUIRE_SSHD=1 is set")
        pytest.skip("network namespaces need root")
    lab = Netns.create(names=("p0", "p1"))
    try:
        yield lab
    finally:
        lab.destroy()


def _hosts_file(lab, name: str) -> pathlib.Path:
    return pathlib.Path(f"/etc/netns/{lab.namespaces[name]}/hosts")


def _start_pod(lab, index: int, workdir: pathlib.Path, *trainer_args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOB_COMPLETION_INDEX": str(index),
           "HOSTNAME": f"job-{index}", **pod_env("job", "svc", 2, False, 2222, threads_per_task=1, dns_timeout=120)}
    workdir.mkdir()
    return subprocess.Popen(
        ["ip", "netns", "exec", lab.namespaces[f"p{index}"], sys.executable, "-m", "launcher.bootstrap.k8s_pod", "--",
         sys.executable, "-m", "launcher.trainer", *trainer_args],
        env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_pods_wait_for_each_others_names_and_train_to_equal_weights(pods, tmp_path):
    lab = pods
    # As the headless Service makes them: each pod resolves job-<i>.svc to pod i's address; pod 1's
    # record of pod 0 appears only later (pod 0 was scheduled later).
    records = {f"job-{i}.svc": lab.hosts[f"p{i}"] for i in range(2)}
    _hosts_file(lab, "p0").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in records.items()))
    _hosts_file(lab, "p1").write_text(f"127.0.0.1 localhost\n{records['job-1.svc']} job-1.svc\n")
    model_dir = tmp_path / "model"
    args = ["--model", "small", "--dataset", "synthetic", "--threads", "1", "--train-steps", "5", "--log-every", "1",
            "--model-dir", str(model_dir)]
    second = _start_pod(lab, 1, tmp_path / "pod1", *args)
    try:
        waiting = second.stdout.readline()  # the bootstrap's first line, before anything else runs
        assert "worker:1 (pod 1): waiting up to 120 s for these pods' names to resolve: job-0.svc" in waiting
        with _hosts_file(lab, "p1").open("a") as hosts:  # in place: the namespace's mount sees it
            hosts.write(f"{records['job-0.svc']} job-0.svc\n")
        first = _start_pod(lab, 0, tmp_path / "pod0", *args)
        out0, _ = first.communicate(timeout=240)
        out1, _ = second.communicate(timeout=60)
    finally:
        for proc in (second, locals().get("first")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first.returncode == 0, out0[-3000:]
    assert second.returncode == 0, out1[-3000:]
    done_line = next(line for line in out0.splitlines() if line.startswith("done step=5"))
    fingerprints = done_line.split("fingerprints=")[1].split(",")
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]


@pytest.mark.netns
def test_each_pod_gives_nccl_and_gloo_the_interface_that_joins_the_pods(pods, tmp_path):
    """The lab's hosts have mgmt0 first, on a network that joins nothing, and eth0."""
    lab = pods
    records = "".join(f"{lab.hosts[f'p{i}']} job-{i}.svc\n" for i in range(2))
    for index in range(2):
        _hosts_file(lab, f"p{index}").write_text("127.0.0.1 localhost\n" + records)
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOB_COMPLETION_INDEX": "1",
           **pod_env("job", "svc", 2, False, 2222, dns_timeout=10)}
    done = subprocess.run(["ip", "netns", "exec", lab.namespaces["p1"], sys.executable, "-m", "launcher.bootstrap.k8s_pod",
                           "--", "sh", "-c", 'echo "$NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME $RANK"'],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "=eth0 eth0 1\n"


@pytest.mark.netns
def test_a_pod_whose_peers_never_resolve_gives_up_in_time_and_names_them(pods, tmp_path):
    lab = pods
    _hosts_file(lab, "p1").write_text("127.0.0.1 localhost\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "JOB_COMPLETION_INDEX": "1",
           **pod_env("job", "svc", 2, False, 2222, dns_timeout=2)}
    done = subprocess.run(["ip", "netns", "exec", lab.namespaces["p1"], sys.executable, "-m", "launcher.bootstrap.k8s_pod",
                           "--", "true"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "these pods' names did not resolve within 2 s: job-0.svc, job-1.svc" in done.stderr
    assert "headless Service svc" in done.stderr
