"""Why an attempt failed, charged to one task and its host, from what the attempt showed and what
the run's hosts answer now (a fresh login, the reachability test run again); causes.py classifies
what is gathered here, and the policy's rules between attempts read the cause."""

from __future__ import annotations

import concurrent.futures
import signal
from typing import Sequence

from launcher.plan.planner import TaskPlan
from launcher.supervise import causes, diagnosis, policy
from launcher.supervise.attempt import Attempt, AttemptTask
from launcher.supervise.hosts import MAX_LOGINS_AT_ONCE, HostActions
from launcher.supervise.status import FAILED, INTERRUPTED, STALLED, START_TIMEOUT
from launcher.supervise.summary import at_fault, program_error


def charge(stop: policy.Stop, attempt: Attempt, hosts: HostActions, plans: Sequence[TaskPlan]) -> causes.Cause | None:
    """The cause of `attempt`'s failure (it stopped so), charged to a task and its host."""
    tasks = attempt.tasks
    by_name = attempt.by_name
    progress = attempt.progress()
    if stop.status == STALLED:
        return _stall(attempt, hosts, progress)
    charged: AttemptTask | None = None
    if stop.status == FAILED and stop.failed in by_name:
        failed = by_name[stop.failed]
        peers = [t for t in tasks if t is not failed and not t.sidecar]
        view = at_fault(attempt.view(failed), [attempt.view(t) for t in peers])
        charged = by_name[view.name]
    elif stop.status == START_TIMEOUT and stop.missing:
        charged = by_name.get(stop.missing[0])
    # A task whose host stopped answering is charged before any other: the others' failures follow from it.
    lost = next((t for t in tasks if t.proc.lost() is not None), None)
    if lost is not None and stop.status != INTERRUPTED:
        charged = lost
    stopped = _seen_stopped(attempt) if stop.status == FAILED and lost is None else None
    if stopped is not None:  # the failures of the tasks that waited for it follow from it (a heartbeat's timeout)
        return causes.classify(causes.Evidence(STALLED, stopped.plan.name, stopped.plan.host, stopped=True,
                                               progress=progress))
    if charged is None:
        return causes.classify(causes.Evidence(stop.status, progress=progress))
    reason = charged.proc.lost()
    login_ok = None
    code = attempt.codes_at_stop.get(charged.plan.name)
    if reason is None and charged is not by_name.get(stop.failed) and code is None and stop.status == FAILED:
        reason = f"{charged.plan.name} stopped answering its peers"  # blamed by them, its own end unseen
        login_ok = hosts.login_ok(charged.plan)
        if login_ok is not False:
            reason = None
    elif reason is not None:
        login_ok = hosts.login_ok(charged.plan)
    view = attempt.view(charged)
    unreachable = None
    said = view.hint_lines() + (attempt.view(by_name[stop.failed]).hint_lines() if stop.failed in by_name else [])
    if reason is None and diagnosis.NETWORK_FAILURES & set(diagnosis.known_failures(said)):
        # The task says it could not reach a peer: the reachability test, run again, names the pair.
        unreachable = hosts.unreachable(plans)
        if unreachable is not None:
            charged = next((t for t in tasks if t.plan.host == unreachable[1]), charged)
            code = attempt.codes_at_stop.get(charged.plan.name)
            view = attempt.view(charged)
    if code not in (None, 0):
        error = program_error(view)
    elif stop.failed in by_name and by_name[stop.failed] is not charged:  # blamed by the task that failed
        error = program_error(attempt.view(by_name[stop.failed]))
    else:
        error = None
    out_of_memory = charged.proc.out_of_memory() if code == -signal.SIGKILL else None
    return causes.classify(causes.Evidence(
        stop.status, charged.plan.name, charged.plan.host, code, error=error,
        lost=reason, login_ok=login_ok, asked=hosts.question, unreachable=unreachable, progress=progress,
        out_of_memory=out_of_memory))


def _stall(attempt: Attempt, hosts: HostActions, progress: int | None) -> causes.Cause | None:
    """A stall, charged after the hosts are judged (causes.stall_evidence): each remote host
    answers a fresh login, all at once, unless a connection was already found lost."""
    states = [causes.TaskState(t.plan.name, t.plan.host, t.plan.local, t.proc.lost(), t.stopped_at is not None)
              for t in attempt.tasks if not t.sidecar]
    lost = [s.host for s in states if s.lost is not None and not s.local][:1]
    judged = {plan.host: plan for plan in (t.plan for t in attempt.tasks if not t.sidecar and not t.plan.local)
              if not lost or plan.host in lost}
    logins: dict[str, bool | None] = {}
    if judged:
        with concurrent.futures.ThreadPoolExecutor(min(len(judged), MAX_LOGINS_AT_ONCE), thread_name_prefix="login") as pool:
            logins = dict(zip(judged, pool.map(hosts.login_ok, judged.values())))
    return causes.classify(causes.stall_evidence(states, logins, progress, hosts.question))


def _seen_stopped(attempt: Attempt) -> AttemptTask | None:
    """A training task seen stopped (SIGSTOP, or a debugger) and still running when the attempt failed."""
    return next((t for t in attempt.tasks if t.stopped_at is not None and not t.sidecar
                 and attempt.codes_at_stop.get(t.plan.name) is None), None)
