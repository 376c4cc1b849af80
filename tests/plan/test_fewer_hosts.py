"""The plans made again for fewer hosts (--min-hosts): pure, from the spec without the hosts left
out (config.spec.without_hosts) through the planner. Indices 0..n-1, the chief kept, every
framework's variables for the job left, the coordinator moved when its host was lost, and the
planned size (MGPU_WORLD_SIZE_MAX, MGPU_HOSTS_MAX) in every task."""

import dataclasses
import json

from launcher.config.spec import ClusterSpec, TaskSpec, build_tasks, with_tasks_back, without_hosts
from launcher.config.addresses import Endpoint
from launcher.plan.network import interface_env, with_interfaces_of
from launcher.plan.planner import plan_tasks
from launcher.cli.runs import size_line
from launcher.supervise.sizes import SizeChange, renamed


def spec(*hosts: str, chief: str | None = None, evaluator: str | None = None) -> ClusterSpec:
    tasks = build_tasks(Endpoint(chief, 2222) if chief else None, [Endpoint(h, 2222) for h in hosts],
                        Endpoint(evaluator) if evaluator else None, None)
    return ClusterSpec(tasks=tasks, command=("python3", "train.py"))


def plans_of(s: ClusterSpec):
    return plan_tasks(s, run_id="r", local_hosts=frozenset(), launcher_python="python3", max_restarts=2)


def job(plan) -> dict:
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
             "JAX_PROCESS_ID", "KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
             "KERAS_DISTRIBUTION_PROCESS_ID", "TORCHELASTIC_RUN_ID", "MGPU_WORLD_SIZE_MAX", "MGPU_HOSTS_MAX",
             "MGPU_TASK_TYPE", "MGPU_TASK_INDEX")
    return {name: plan.env.get(name) for name in names}


def test_a_worker_host_lost_renumbers_the_workers_left():
    before = plans_of(spec("h1", "h2", "h3"))
    after = plans_of(without_hosts(spec("h1", "h2", "h3"), ["h2"]))
    assert [(p.name, p.host) for p in after] == [("worker:0", "h1"), ("worker:1", "h3")]
    assert json.loads(after[1].env["TF_CONFIG"]) == {"cluster": {"worker": ["h1:2222", "h3:2222"]},
                                                     "task": {"type": "worker", "index": 1}}
    assert job(after[1]) == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "NODE_RANK": "1",
        "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "MASTER_ADDR": "h1", "MASTER_PORT": "2222",
        "JAX_COORDINATOR_ADDRESS": "h1:2222", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h1:2222,h3:2222", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1", "TORCHELASTIC_RUN_ID": "r", "MGPU_WORLD_SIZE_MAX": "3",
        "MGPU_HOSTS_MAX": "3", "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": "1"}
    assert renamed(before, after) == [("worker:2", "worker:1")]


def test_the_planned_size_is_every_tasks_and_kept_through_shrinks():
    full = plans_of(spec("h1", "h2", "h3", chief="h0", evaluator="h9"))
    assert {(p.env["MGPU_WORLD_SIZE_MAX"], p.env["MGPU_HOSTS_MAX"]) for p in full} == {("4", "4")}
    twice = without_hosts(without_hosts(spec("h1", "h2", "h3", chief="h0"), ["h3"]), ["h1"])
    assert [(p.name, p.env["WORLD_SIZE"], p.env["MGPU_WORLD_SIZE_MAX"], p.env["MGPU_HOSTS_MAX"])
            for p in plans_of(twice)] == [("chief:0", "2", "4", "4"), ("worker:0", "2", "4", "4")]


def test_the_coordinators_host_lost_moves_the_coordinator_to_the_first_worker_left():
    after = plans_of(without_hosts(spec("h1", "h2", "h3"), ["h1"]))
    assert [(p.name, p.host) for p in after] == [("worker:0", "h2"), ("worker:1", "h3")]
    assert {(p.env["MASTER_ADDR"], p.env["JAX_COORDINATOR_ADDRESS"], p.env["GROUP_RANK"]) for p in after[:1]} == {
        ("h2", "h2:2222", "0")}
    assert after[1].env["MASTER_ADDR"] == "h2" and after[0].coordinator.address == "h2"


def test_the_chiefs_host_lost_gives_the_chief_role_to_the_first_worker_left():
    after = plans_of(without_hosts(spec("h1", "h2", chief="h0", evaluator="h9"), ["h0"]))
    assert [(p.name, p.host) for p in after] == [("chief:0", "h1"), ("worker:0", "h2"), ("evaluator:0", "h9")]
    assert json.loads(after[1].env["TF_CONFIG"])["cluster"] == {"chief": ["h1:2222"], "worker": ["h2:2222"]}
    assert after[1].env["MASTER_ADDR"] == "h1" and after[1].env["RANK"] == "1"


def test_a_chief_whose_host_stays_keeps_its_role():
    after = plans_of(without_hosts(spec("h1", "h2", chief="h0"), ["h1"]))
    assert [(p.name, p.host) for p in after] == [("chief:0", "h0"), ("worker:0", "h2")]


def test_a_host_keeps_the_interface_its_checks_found():
    before = plans_of(spec("h1", "h2", "h3"))
    before = [dataclasses.replace(p, env=p.env.adding(interface_env(f"eth{i}"))) for i, p in enumerate(before)]
    after = with_interfaces_of(plans_of(without_hosts(spec("h1", "h2", "h3"), ["h2"])), before)
    assert [(p.host, p.env["GLOO_SOCKET_IFNAME"], p.env["NCCL_SOCKET_IFNAME"]) for p in after] == [
        ("h1", "eth0", "=eth0"), ("h3", "eth2", "=eth2")]


def test_the_size_change_as_recorded_and_said():
    before = plans_of(spec("h1", "h2", "h3"))
    after = plans_of(without_hosts(spec("h1", "h2", "h3"), ["h2"]))
    change = SizeChange.of(1_700_000_000.0, ["h2"], "h2: host-lost: gone", before, after, 3)
    assert change.to_dict() == {"at": "2023-11-14T22:13:20.000+00:00", "dropped": ["h2"], "back": [], "why": "h2: host-lost: gone",
                                "hosts": {"from": 3, "to": 2, "planned": 3}, "tasks": {"from": 3, "to": 2},
                                "renamed": {"worker:2": "worker:1"}}
    assert change.notice(2) == ("no spare host for h2: the run goes on on 2 of 3 hosts (--min-hosts 2), "
                                "2 tasks in place of 3; worker:2 is worker:1 now")
    assert change.story(1_700_000_000.0 + 41 * 60) == "ran on 2 of 3 hosts for 41 min 0 s"
    assert size_line({"hosts": 2, "planned_hosts": 3, "since": "2023-11-14T22:13:20.000+00:00"}) == \
        "size: 2 of 3 hosts since 2023-11-14 22:13:20 (UTC)"
    assert size_line({"hosts": "2\x1b[31m", "planned_hosts": 3}) is None  # anyone's text: numbers only
    # Back on every host planned: nothing to say.
    assert size_line({"hosts": 3, "planned_hosts": 3, "since": "2023-11-14T22:13:20.000+00:00"}) is None


def test_hosts_taken_back_are_numbered_after_the_tasks_running_and_a_chief_back_is_a_worker():
    first = spec("h1", "h2", chief="h0")
    shrunk = without_hosts(first, ["h0"])
    back = with_tasks_back(shrunk, [task for task in first.tasks if task.host == "h0"])
    assert [(p.name, p.host, p.env["WORLD_SIZE"], p.env["MGPU_WORLD_SIZE_MAX"]) for p in plans_of(back)] == [
        ("chief:0", "h1", "3", "3"), ("worker:0", "h2", "3", "3"), ("worker:1", "h0", "3", "3")]
    grown = SizeChange.of(1_700_000_000.0, (), "taken back", plans_of(shrunk), plans_of(back), 3, back=["h0"])
    assert grown.back_notice() == "h0 back: the run goes on on 3 of 3 hosts, 3 tasks in place of 2"
