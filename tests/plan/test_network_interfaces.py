"""The interface NCCL and Gloo get: chosen per task from what the preflight found on its host,
never over the user's own choice. Pure functions, no hosts."""

from launcher.config.spec import ClusterSpec, TaskSpec
from launcher.host.interfaces import interface_holding
from launcher.plan.network import with_interfaces
from launcher.plan.planner import plan_tasks
from launcher.preflight.reach import describe_interfaces

ADDRESSES = [("127.0.0.1", "lo"), ("::1", "lo"), ("10.0.0.5", "mgmt0"), ("192.168.7.5", "eth1"),
             ("fe80::1", "eth1")]


def plans(env=None, hosts=("h1", "h2"), local_hosts=frozenset()):
    spec = ClusterSpec(tasks=tuple(TaskSpec("worker", host, 2222) for host in hosts), command=("prog",),
                       env=env or {})
    return plan_tasks(spec, run_id="r", local_hosts=local_hosts, launcher_python="python3")


def test_each_task_gets_its_hosts_interface_nccl_by_exact_name():
    planned = with_interfaces(plans(), {"worker:0": "eth1", "worker:1": "ens5"})
    assert [(p.env["NCCL_SOCKET_IFNAME"], p.env["GLOO_SOCKET_IFNAME"]) for p in planned] == [
        ("=eth1", "eth1"), ("=ens5", "ens5")]
    # TF_CONFIG and the rest stay as planned.
    assert [p.tf_config for p in planned] == [p.tf_config for p in plans()]
    assert planned[0].env["RANK"] == "0" and planned[1].env["MASTER_ADDR"] == "h1"


def test_a_task_whose_interface_is_unknown_keeps_its_env():
    original = plans()
    planned = with_interfaces(original, {"worker:0": None})
    assert dict(planned[0].env) == dict(original[0].env) and dict(planned[1].env) == dict(original[1].env)
    assert "NCCL_SOCKET_IFNAME" not in planned[0].env


def test_the_users_choice_wins_from_the_plan_or_for_local_tasks_from_the_launchers_environment():
    planned = with_interfaces(plans(env={"GLOO_SOCKET_IFNAME": "ib0"}), {"worker:0": "eth1", "worker:1": "eth1"})
    assert [p.env["GLOO_SOCKET_IFNAME"] for p in planned] == ["ib0", "ib0"]
    assert all("NCCL_SOCKET_IFNAME" not in p.env for p in planned)  # one choice of the user's covers both

    mixed = plans(hosts=("gpu1", "h2"), local_hosts=frozenset({"gpu1"}))  # gpu1: this machine's name
    planned = with_interfaces(mixed, {"worker:0": "lo", "worker:1": "eth1"}, frozenset({"NCCL_SOCKET_IFNAME"}))
    # The local task inherits the launcher's NCCL_SOCKET_IFNAME; the remote one does not, so it gets eth1.
    assert "GLOO_SOCKET_IFNAME" not in planned[0].env and planned[1].env["GLOO_SOCKET_IFNAME"] == "eth1"


def test_the_interface_is_the_one_holding_the_address_the_others_dial():
    assert interface_holding(["192.168.7.5"], ADDRESSES) == "eth1"
    assert interface_holding(["10.0.0.5"], ADDRESSES) == "mgmt0"
    assert interface_holding(["fe80::1"], ADDRESSES) == "eth1"
    # All of 127.0.0.0/8 is the loopback interface's, though only 127.0.0.1 is listed.
    assert interface_holding(["127.0.0.2"], ADDRESSES) == "lo"
    # An address no interface holds (NAT), then one that is held: the first held one counts.
    assert interface_holding(["203.0.113.9"], ADDRESSES) is None
    assert interface_holding(["203.0.113.9", "10.0.0.5"], ADDRESSES) == "mgmt0"
    assert interface_holding([], ADDRESSES) is None


def test_each_host_is_judged_by_the_address_the_other_hosts_dialed():
    """h1 resolves its own name to 127.0.1.1 (Debian's /etc/hosts); h2 dialed 10.0.0.1 for it."""
    from launcher.preflight.reach import _interface

    h1 = {"dialed": {"h1:2222": "127.0.1.1", "h2:2222": "10.0.0.2"},
          "addresses": [["127.0.0.1", "lo"], ["192.168.9.1", "mgmt0"], ["10.0.0.1", "eth0"]]}
    h2 = {"dialed": {"h1:2222": "10.0.0.1", "h2:2222": "10.0.0.2"},
          "addresses": [["127.0.0.1", "lo"], ["10.0.0.2", "eth0"]]}
    assert _interface("h1:2222", [h2], h1) == "eth0"
    assert _interface("h2:2222", [h1], h2) == "eth0"
    assert _interface("h1:2222", [h1], h1) == "lo"  # a lone host goes by its own view
    assert _interface("h1:2222", [{"dialed": "junk"}], h1) is None


def test_the_check_names_each_hosts_interface_in_one_line():
    planned = plans(hosts=("h1", "h1", "h2", "h3"))
    line = describe_interfaces(planned, {"worker:0": "eth1", "worker:1": "eth1", "worker:2": "ens5",
                                         "worker:3": None})
    assert line == "NCCL and Gloo use eth1 on h1, ens5 on h2; no interface holds the address of h3: NCCL and Gloo choose there"
