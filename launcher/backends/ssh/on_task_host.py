"""What is run on a remote task's host beside the task, over the run's connection to it: py-spy's
stacks of the task's tree and a command beside the task (run_beside). Shared by the tasks of a
session of their own (backend.py) and those of a host agent (agent_task.py)."""

from __future__ import annotations

import shlex

from launcher.errors import MgpuError
from launcher.host import beside_task, py_spy
from launcher.plan.planner import TaskPlan


class OnTaskHost:
    """For a TaskProcess whose `_conn` is its host's Connection, `pid` its process group there, and
    `answer_timeout` how long its host has to answer (the connect timeout)."""

    answer_timeout: float

    def answers(self) -> bool | None:
        """A keepalive answered within the connect timeout (Connection.answers): asked on a stall, so
        that a host cut off is judged lost without waiting for its tasks' stacks."""
        if self.poll() is not None:
            return None if self._conn.active else False
        return self._conn.answers(self.answer_timeout)

    def spy_stacks(self, native: bool, task: TaskPlan, timeout: float) -> py_spy.Answer | None:
        """The task's whole tree (its process group and their descendants), dumped on its host over
        the task's connection."""
        if self.poll() is not None:
            return py_spy.Answer(None, problem="the task has ended")
        nonce = py_spy.new_nonce()
        python = task.argv[0] if task.argv else ""
        if task.workdir and not python.startswith("/"):  # relative to the task's folder, as it ran
            python = f"{task.workdir.rstrip('/')}/{python}"
        command = py_spy.script(py_spy.listing_of_tree(self.pid), native, [python], nonce, py_spy.configured())
        try:
            _, out, _ = self._conn.run(command, timeout, limit=py_spy.MAX_PROCESSES * (py_spy.DUMP_LIMIT + 4096))
        except MgpuError as e:
            return py_spy.Answer(None, problem=str(e))
        return py_spy.parse_answer(out, nonce)

    def run_beside(self, command: str, task: TaskPlan, timeout: float, limit: int) -> beside_task.Ran:
        """On the task's host, over the task's connection."""
        if task.workdir:
            command = f"cd {shlex.quote(task.workdir)} || exit 1\n{command}"
        try:
            status, out, _ = self._conn.run(beside_task.with_task_path(command, task.env), timeout, limit=limit)
        except MgpuError as e:
            return beside_task.Ran(None, problem=str(e))
        return beside_task.Ran(status, out[:limit])
