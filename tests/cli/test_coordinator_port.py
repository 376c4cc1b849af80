"""The coordinator's port, from a task's plan."""

from __future__ import annotations

import json

from launcher.config.spec import SshSettings
from launcher.plan.coordinator import coordinator_port
from launcher.plan.planner import TaskPlan


def plan_with(env: dict) -> TaskPlan:
    return TaskPlan("worker", 1, "h2", 2223, False, SshSettings(), ("python3",), env, None, False)


def tf_config(cluster: dict) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})}


def test_the_chief_coordinates_when_there_is_one():
    cluster = {"worker": ["h2:2223", "h3:2224"], "chief": ["h1:2300"], "evaluator": ["h4:9"]}
    assert coordinator_port(plan_with(tf_config(cluster))) == 2300


def test_else_worker_0_and_ipv6_addresses():
    assert coordinator_port(plan_with(tf_config({"worker": ["[::1]:2301", "h2:2223"]}))) == 2301


def test_no_cluster_means_no_coordinator():
    assert coordinator_port(plan_with({"TF_CONFIG": "{}"})) is None
    assert coordinator_port(plan_with({})) is None
    assert coordinator_port(plan_with(tf_config({"worker": ["h1"]}))) is None


def test_a_planned_task_env_is_read_without_building_tf_config():
    from launcher.plan.planner import TaskEnv

    cluster = {"chief": ["h1:2300"], "worker": ["h2:2223"]}
    env = TaskEnv(cluster, json.dumps(cluster), {"type": "worker", "index": 0}, {})
    assert coordinator_port(plan_with(env)) == 2300


def test_a_hand_made_plan_has_the_same_shape_as_a_planned_one():
    """One type for every plan's env, and one name for where the others reach a task."""
    from launcher.plan.planner import TaskEnv

    text = '{"cluster":{"worker":["h1:2300","h2:2222"]},"task":{"type":"worker","index":1}}'
    plan = TaskPlan("worker", 1, "h2", 2222, False, None, ("true",), {"TF_CONFIG": text, "A": "b"}, None, False)
    assert isinstance(plan.env, TaskEnv) and dict(plan.env) == {"TF_CONFIG": text, "A": "b"}
    assert plan.env.cluster == {"worker": ["h1:2300", "h2:2222"]} and coordinator_port(plan) == 2300
    assert plan.address == "h2" and not plan.reached_elsewhere
    aliased = TaskPlan("worker", 0, "gpu1", 2222, False, None, ("true",), {}, None, False, address="10.0.0.5")
    assert aliased.reached_elsewhere and "TF_CONFIG" not in aliased.env and len(aliased.env) == 0
