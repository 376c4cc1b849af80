"""The supervisor's policy as its tests drive it: a policy with given rules, its attempts started and made ready."""

from launcher.supervise.policy import Policy, Ready, ReadyLineSeen, Rules, TaskRole, Watch

WORKERS = [TaskRole("worker:0"), TaskRole("worker:1")]


def policy(start_timeout=10.0, stall_timeout=0.0, **rules):
    return Policy(Rules(start_timeout=start_timeout, stall_timeout=stall_timeout, **rules), grace_period=7)


def last(decisions):
    return decisions[-1]


def ready(decisions):
    return [d.name for d in decisions if isinstance(d, Ready)]


def started(p, roles=WORKERS, now=100.0):
    decisions = p.begin_attempt(roles, now)
    assert isinstance(last(decisions), Watch)
    return decisions


def all_ready(p, roles=WORKERS, now=100.0):
    started(p, roles, now)
    decisions = p.on([ReadyLineSeen(r.name) for r in roles if not r.ready_when_started], now)
    assert ready(decisions) == [r.name for r in roles if not r.ready_when_started]
    return decisions
