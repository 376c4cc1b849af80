"""A task that would leave core files when asked for its stacks: it turns core dumps on (as
`ulimit -c unlimited` would) and starts a child shell that, on SIGABRT, writes its own core file
limit at that moment (the line of /proc/<pid>/limits) to limits-<task index>.txt in the current
folder. The shell waits on a `sleep` that ignores SIGABRT: a signal that reaches every process of
the task may reach the sleep first, and a shell whose only job has ended leaves `wait` and exits
before its trap runs. Once the children of every task of the job (WORLD_SIZE, all in the same
folder) have set their traps (child-ready-<index> appear) it says it is ready and waits in
silence; until then it prints, which is progress to the stall watchdog: no task is asked for its
stacks before its child can answer, however slowly the others start.
Every process of it dumps core on SIGABRT unless its limit was lowered first; the task itself ends
only once the children of every task have written their limits: a step whose first task has ended
is stopped at once, children included."""

import faulthandler
import os
import pathlib
import resource
import signal
import subprocess
import time

INDEX = os.environ.get("MGPU_TASK_INDEX", "0")
TASKS = int(os.environ.get("WORLD_SIZE", "1"))

resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
# On ABRT the shell first ignores TERM and INT (and so does its grep): the launcher stops what is
# left of the task at once, and the limits file appears whole or not at all.
ON_ABRT = (f"trap '' TERM INT; grep '^Max core file size' /proc/$$/limits > limits-{INDEX}.tmp "
           f"&& mv limits-{INDEX}.tmp limits-{INDEX}.txt; kill \\$sleeper; exit 3")
subprocess.Popen(["sh", "-c", f'trap "{ON_ABRT}" ABRT; (trap "" ABRT; exec sleep 600) & sleeper=$!; '
                  f'touch child-ready-{INDEX}; wait'])


def end_after_the_child(signum, frame):
    """On ABRT this process ends only once every task's child has written its limits (bounded): a step
    whose first task has ended is stopped at once, and on a busy machine the other tasks' children
    could be stopped before they wrote.
    It then ends by ABRT as it would have: faulthandler (where the launcher turned it on) writes the
    stack, then the default action dumps core unless its own limit was lowered too."""
    for _ in range(600):
        if all(pathlib.Path(f"limits-{index}.txt").exists() for index in range(TASKS)):
            break
        time.sleep(0.1)
    signal.signal(signal.SIGABRT, signal.SIG_DFL)
    if faulthandler.is_enabled():  # its handler again, now in front of the default action
        faulthandler.disable()
        faulthandler.enable()
    os.kill(os.getpid(), signal.SIGABRT)


signal.signal(signal.SIGABRT, end_after_the_child)
for _ in range(1200):
    if all(pathlib.Path(f"child-ready-{index}").exists() for index in range(TASKS)):
        break
    print("waiting for the child shells", flush=True)
    time.sleep(0.1)
print("MGPU_TASK_READY", flush=True)
for _ in range(600):
    time.sleep(1)
