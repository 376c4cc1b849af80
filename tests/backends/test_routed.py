"""Backends as the supervisor sees them: one per run, Routed where a run mixes kinds of tasks."""

from __future__ import annotations

import pytest

from launcher.errors import TaskFailed
from launcher.backends.base import Attempt, Backend, Routed, Strays, TaskByTask
from launcher.backends.local import LocalBackend
from launcher.supervise.supervisor import SuperviseOptions, supervise
from supervisor_helpers import assert_run_gone, make_plans

pytestmark = pytest.mark.timeout(60)


class _Recording(LocalBackend):
    """The local backend, noting what the supervisor asks of it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def begin_attempt(self, tasks, attempt: int) -> Attempt:
        self.calls.append(("begin", attempt, [t.name for t in tasks]))
        return _NotedAttempt(self, super().begin_attempt(tasks, attempt))

    def check_ports(self, tasks) -> None:
        self.calls.append(("check_ports", [t.name for t in tasks]))
        super().check_ports(tasks)

    def close(self) -> None:
        self.calls.append(("close",))


class _RecordingElsewhere(_Recording):
    """Stands for a backend of other machines (SSH): no run dir to write to."""

    def writes_here(self, task) -> bool:
        return False


class _NotedAttempt(Attempt):
    def __init__(self, backend: _Recording, attempt: Attempt):
        self._backend = backend
        self._attempt = attempt

    def start(self, task):
        self._backend.calls.append(("start", task.name))
        return self._attempt.start(task)

    def end(self) -> None:
        self._backend.calls.append(("end",))


def test_a_routed_run_gives_each_backend_its_own_tasks_on_every_attempt(run_id, tmp_path):
    plans = make_plans(run_id, ["--fail", "worker:1=3"], workers=2)
    first, second = _Recording(), _RecordingElsewhere()
    backend = Routed([first, second], lambda plan: first if plan.index == 0 else second)
    options = SuperviseOptions(run_id=run_id, log_dir=tmp_path / "runs", grace_period=2.0, max_restarts=1)
    with open(tmp_path / "console.txt", "w") as console, pytest.raises(TaskFailed, match="worker:1"):
        supervise(plans, backend, options, console)
    assert_run_gone(run_id)
    for recorder, name in ((first, "worker:0"), (second, "worker:1")):
        each_attempt = [call for n in (0, 1) for call in (("begin", n, [name]), ("start", name), ("end",))]
        assert recorder.calls == [("check_ports", [name]), *each_attempt]
    backend.close()
    assert first.calls[-1] == second.calls[-1] == ("close",)


class _Failing(Backend):
    """A backend whose every duty raises after noting it was asked."""

    def __init__(self, log: list, name: str, fails: bool):
        self.log, self.name, self.fails = log, name, fails

    def _note(self, what: str) -> None:
        self.log.append((self.name, what))
        if self.fails:
            raise RuntimeError(f"{self.name} {what}")

    def begin_attempt(self, tasks, attempt):
        self._note("begin")
        backend = self

        class _Ending(TaskByTask):
            def end(self) -> None:
                backend._note("end")
        return _Ending(lambda task, n: None, attempt)

    def strays(self, run_id):
        return Strays()

    def close(self) -> None:
        self._note("close")


@pytest.mark.fast
def test_routed_ends_and_closes_every_backend_though_one_raises():
    log: list = []
    a, b, c = _Failing(log, "a", fails=False), _Failing(log, "b", fails=True), _Failing(log, "c", fails=False)
    plans = make_plans("routed-unit", [], workers=3)
    routed = Routed([a, b, c], lambda plan: (a, b, c)[plan.index])

    with pytest.raises(RuntimeError, match="^b begin$"):
        routed.begin_attempt(plans, 0)
    assert log == [("a", "begin"), ("b", "begin"), ("a", "end")]  # what had begun is ended

    b.fails = False
    attempt = routed.begin_attempt(plans, 1)
    b.fails = True
    log.clear()
    with pytest.raises(RuntimeError, match="^b end$"):
        attempt.end()
    with pytest.raises(RuntimeError, match="^b close$"):
        routed.close()
    assert log == [(name, what) for what in ("end", "close") for name in "abc"]


@pytest.mark.fast
def test_routed_answers_writes_here_for_the_backend_of_each_task():
    local = LocalBackend()
    remote = _Failing([], "remote", fails=False)
    plans = make_plans("routed-unit", [], workers=2)
    routed = Routed([local, remote], lambda plan: local if plan.index == 0 else remote)
    assert [routed.writes_here(plan) for plan in plans] == [True, False]
