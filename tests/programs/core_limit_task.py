"""A task that would leave core files when asked for its stacks: it turns core dumps on (as
`ulimit -c unlimited` would), says it is ready, and starts a child shell that, on SIGABRT, writes
its own core file limit at that moment (the line of /proc/<pid>/limits) to limits.txt in the
current folder, and a `sleep`. It then waits; child-ready appears once the child's trap is set.
Every process of it dumps core on SIGABRT unless its limit was lowered first."""

import resource
import subprocess
import time

resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print("MGPU_TASK_READY", flush=True)
# On ABRT the shell first ignores TERM and INT (and so does its grep): the launcher stops what is
# left of the task at once, and limits.txt appears whole or not at all.
ON_ABRT = "trap '' TERM INT; grep '^Max core file size' /proc/$$/limits > limits.tmp && mv limits.tmp limits.txt; exit 3"
subprocess.Popen(["sh", "-c", f'trap "{ON_ABRT}" ABRT; sleep 600 & touch child-ready; wait'])
for _ in range(600):
    time.sleep(1)
