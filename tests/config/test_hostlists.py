"""Slurm hostlists and the host syntax of Horovod and MPI, read as those tools mean them."""

import json
import shutil
import subprocess

import pytest

from launcher.config.hostlist import expand_hostlist, expand_tasks_per_node

# The cases of TensorFlow's slurm_cluster_resolver_test.py, then multi-group, padding and order cases.
HOSTLISTS = [
    ("n1", ["n1"]),
    ("n[1,3]", ["n1", "n3"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1-2],m5,o[3-4,6,7-9]", ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
    ("n[0001-0003],m5,o[009-011]", ["n0001", "n0002", "n0003", "m5", "o009", "o010", "o011"]),
    ("host[01-03]", ["host01", "host02", "host03"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("h[1-2]x[3-4]", ["h1x3", "h1x4", "h2x3", "h2x4"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("n[9-11]", ["n9", "n10", "n11"]),  # node9 before node10: Slurm's order, never sorted by name
    ("n[10,9]", ["n10", "n9"]),
]

TASKS_PER_NODE = [
    ("2", [2]),
    ("2,1,3", [2, 1, 3]),
    ("3(x2),2,1", [3, 3, 2, 1]),
    ("3(x2),2,11(x4)", [3, 3, 2, 11, 11, 11, 11]),
    ("13(x10)", [13] * 10),
    ("2(x3),1", [2, 2, 2, 1]),
]


@pytest.mark.parametrize("text, hosts", HOSTLISTS)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, counts", TASKS_PER_NODE)
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs Slurm's scontrol")
def test_expansion_matches_slurms_own(tmp_path):
    """Slurm's `scontrol show hostnames` is the reference; it needs only a config file to read."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    for text, hosts in HOSTLISTS:
        shown = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True,
                               env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}, timeout=30)
        assert shown.stdout.split() == hosts, (text, shown.stderr)


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("a,,b", "empty entry"), ("n[3-1]", "goes backwards"), ("n[1-2]]", "unbalanced"),
    ("n[1-x]", None), ("n[0-70000]", "more than 65536"), ("n[0-300]m[0-300]", "expands to 90601 hosts"),
])
def test_bad_hostlists(text, message):
    if message is None:  # not a range: left for the host name check to refuse
        assert expand_hostlist(text) == [text]
        return
    with pytest.raises(ValueError, match=message):
        expand_hostlist(text)


def workers_of(result):
    assert result.exit_code == 0, result.stderr
    tasks = result.json()["tasks"]
    return tasks[0]["tf_config"]["cluster"]["worker"]


def test_hostlist_in_workers_keeps_user_and_port(mgpu):
    result = mgpu("launch", "--workers", "alice@node[01-02]:3000,gpu[9-10],[fd00::1]:4000", "--dry-run", "--json")
    assert workers_of(result) == ["node01:3000", "node02:3000", "gpu9:2222", "gpu10:2222", "[fd00::1]:4000"]
    text = mgpu("launch", "--workers", "alice@node[01-02]:3000", "--dry-run").stdout
    assert "(ssh alice@node02)" in text


def test_horovod_hosts_are_slots(mgpu):
    result = mgpu("launch", "--hosts", "server1:2,server[2-3],[fd00::5]:2", "--port", "5000", "--dry-run", "--json")
    assert workers_of(result) == ["server1:5000", "server1:5001", "server2:5000", "server3:5000",
                                  "[fd00::5]:5000", "[fd00::5]:5001"]


def test_hosts_with_chief(mgpu):
    result = mgpu("launch", "--hosts", "s1:2", "--chief", "s0:2222", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["tasks"][0]["tf_config"]["cluster"] == {"chief": ["s0:2222"], "worker": ["s1:2222", "s1:2223"]}


def test_openmpi_hostfile(mgpu, tmp_path):
    path = tmp_path / "hosts"
    path.write_text("node[1-2] slots = 2 max-slots=4\nnode3 slots=1 max_slots=1\nnode1 slots=1\n")
    result = mgpu("launch", "--hostfile", str(path), "--dry-run", "--json")
    # node1 is listed twice: its slots add up (2 + 1), and it keeps its first place.
    assert workers_of(result) == ["node1:2222", "node1:2223", "node1:2224", "node2:2222", "node2:2223", "node3:2222"]


@pytest.mark.parametrize("text, message", [
    ("h1 slots=4 max_slots=2", "hosts:1: max_slots=2 is below slots=4"),
    ("h1 slots=2 max-slots=2\nh1", "h1 has 3 slots in all, over its max_slots=2"),
    ("h1 max_slots=x", "hosts:1: max_slots must be a positive number"),
    ("n[2-1] slots=2", "hosts:1: 'n[2-1]': range 2-1 goes backwards"),
    ("h1 slots=1 cpus=3", "unknown setting 'cpus=3'"),
])
def test_bad_openmpi_hostfile(mgpu, tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    result = mgpu("launch", "--hostfile", str(path), "--dry-run")
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_hostlist_in_spec(mgpu, tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"cluster": {"chief": "c[1]:2222", "worker": ["w[1-2]:2222", "x"]}, "port": 3000}))
    result = mgpu("launch", "--spec", str(path), "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["tasks"][0]["tf_config"]["cluster"] == {
        "chief": ["c1:2222"], "worker": ["w1:2222", "w2:2222", "x:3000"]}
    path.write_text(json.dumps({"cluster": {"worker": ["w[1-2]:2222"]}, "hosts": {"w[1-2]": {"user": "bob"}}}))
    text = mgpu("launch", "--spec", str(path), "--dry-run").stdout
    assert "(ssh bob@w1)" in text and "(ssh bob@w2)" in text
    path.write_text(json.dumps({"cluster": {"chief": "c[1-2]:2222", "worker": ["w"]}}))
    result = mgpu("launch", "--spec", str(path), "--dry-run")
    assert result.exit_code == 2 and "cluster.chief lists 2 hosts" in result.stderr


def test_this_machines_name_and_loopback_are_one_socket(mgpu):
    import socket

    result = mgpu("launch", "--workers", f"{socket.gethostname()}:3000,127.0.0.1:3000", "--dry-run")
    assert result.exit_code == 2
    assert f"{socket.gethostname()}:3000 (worker:0) and 127.0.0.1:3000 (worker:1) are one socket" in result.stderr
    # Other ports on this machine are fine.
    assert mgpu("launch", "--workers", "localhost:3000,127.0.0.1:3001", "--dry-run").exit_code == 0
