"""--worker-restarts: the pure rule, on a clock moved by hand. A parameter-server worker that fails
is restarted in place within the budget, the attempt going on; the chief, a ps task, a worker of a
cluster without parameter servers, or a worker past the budget stops the attempt as before."""

from launcher.supervise import runrecord
from launcher.supervise.policy import Policy, ReadyLineSeen, RestartTask, Rules, Stop, TaskEnded, TaskRole, Watch

PS_CLUSTER = [TaskRole("chief:0"), TaskRole("worker:0", serves=True), TaskRole("worker:1", serves=True),
              TaskRole("ps:0", serves=True)]


def running(budget: int, roles=PS_CLUSTER) -> Policy:
    p = Policy(Rules(start_timeout=10.0, stall_timeout=0.0, worker_restarts=budget))
    p.begin_attempt(roles, 0.0)
    p.on([ReadyLineSeen(role.name) for role in roles], 1.0)
    return p


def test_a_failed_worker_is_restarted_in_place_until_the_budget_is_spent():
    p = running(2)
    decisions = p.on([TaskEnded("worker:1", -9)], 5.0)
    assert [d for d in decisions if isinstance(d, RestartTask)] == [RestartTask("worker:1")]
    assert isinstance(decisions[-1], Watch)
    assert any("worker:1 was killed by SIGKILL; restarting it in place, the chief and the ps tasks going on "
               "(worker restart 1 of 2)" == getattr(d, "text", "") for d in decisions), decisions
    assert RestartTask("worker:0") in p.on([TaskEnded("worker:0", 1)], 6.0)
    # Running again: its next end is seen, and past the budget the attempt stops as before.
    stop = p.on([TaskEnded("worker:1", 1)], 7.0)[-1]
    assert isinstance(stop, Stop) and stop.status == runrecord.FAILED and stop.failed == "worker:1"


def test_the_chief_and_ps_are_never_restarted_in_place_nor_workers_without_parameter_servers():
    for name in ("chief:0", "ps:0"):
        stop = running(3).on([TaskEnded(name, 1)], 5.0)[-1]
        assert isinstance(stop, Stop) and stop.failed == name
    workers = [TaskRole("worker:0"), TaskRole("worker:1")]  # MultiWorkerMirroredStrategy: they do not serve
    stop = running(3, workers).on([TaskEnded("worker:1", 1)], 5.0)[-1]
    assert isinstance(stop, Stop) and stop.failed == "worker:1"
    stop = running(0).on([TaskEnded("worker:1", 1)], 5.0)[-1]  # the default: no in-place restart
    assert isinstance(stop, Stop) and stop.failed == "worker:1"


def test_the_chief_ending_after_a_worker_restart_ends_the_attempt_with_success():
    p = running(1)
    p.on([TaskEnded("worker:1", 3)], 5.0)
    stop = p.on([TaskEnded("chief:0", 0)], 9.0)[-1]
    assert isinstance(stop, Stop) and stop.status == runrecord.SUCCEEDED
