"""The job's coordinator, as the planner finds it once for every task's plan."""

from __future__ import annotations

from launcher.config.spec import ClusterSpec, TaskSpec
from launcher.plan.coordinator import Coordinator
from launcher.plan.planner import TaskEnv, TaskPlan, plan_tasks


def planned(*tasks: TaskSpec, addresses: dict[str, str] | None = None) -> list[TaskPlan]:
    spec = ClusterSpec(tasks=tasks, addresses=addresses or {})
    return plan_tasks(spec, run_id="r", local_hosts=frozenset(), launcher_python="python3")


def test_the_chief_coordinates_when_there_is_one():
    plans = planned(TaskSpec("worker", "h2", 2223), TaskSpec("worker", "h3", 2224), TaskSpec("chief", "h1", 2300),
                    TaskSpec("evaluator", "h4", None))
    assert {plan.coordinator for plan in plans} == {Coordinator("h1", 2300)}
    assert {plan.coordinator_port for plan in plans} == {2300}


def test_else_worker_0_and_ipv6_addresses():
    plans = planned(TaskSpec("worker", "fd00::1", 2301), TaskSpec("worker", "h2", 2223))
    assert plans[1].coordinator == Coordinator("fd00::1", 2301) and str(plans[1].coordinator) == "[fd00::1]:2301"
    assert plans[1].env["JAX_COORDINATOR_ADDRESS"] == "[fd00::1]:2301" and plans[1].env["MASTER_ADDR"] == "fd00::1"


def test_the_coordinator_is_where_the_other_tasks_reach_its_host():
    plans = planned(TaskSpec("worker", "gpu1", 2222), TaskSpec("worker", "gpu2", 2222), addresses={"gpu1": "10.0.0.5"})
    assert plans[1].coordinator == Coordinator("10.0.0.5", 2222)
    assert plans[1].env["JAX_COORDINATOR_ADDRESS"] == plans[1].tf_config["cluster"]["worker"][0] == "10.0.0.5:2222"


def test_a_hand_made_plan_has_the_same_shape_as_a_planned_one():
    """One type for every plan's env, and one name for where the others reach a task."""
    text = '{"cluster":{"worker":["h1:2300","h2:2222"]},"task":{"type":"worker","index":1}}'
    plan = TaskPlan("worker", 1, "h2", 2222, False, None, ("true",), {"TF_CONFIG": text, "A": "b"}, None, False)
    assert isinstance(plan.env, TaskEnv) and dict(plan.env) == {"TF_CONFIG": text, "A": "b"}
    assert plan.env.cluster == {"worker": ["h1:2300", "h2:2222"]}
    assert plan.address == "h2" and not plan.reached_elsewhere
    assert plan.coordinator is None and plan.coordinator_port is None  # a hand-made plan names its own
    aliased = TaskPlan("worker", 0, "gpu1", 2222, False, None, ("true",), {}, None, False, address="10.0.0.5")
    assert aliased.reached_elsewhere and "TF_CONFIG" not in aliased.env and len(aliased.env) == 0
