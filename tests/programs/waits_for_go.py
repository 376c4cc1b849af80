"""A task that prints "waiting" and then waits, in a function of its own, until the file argv[1]
exists (at most 120 s): what `mgpu stacks` finds it doing."""

import os
import sys
import time


def waits_for_go(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


print("waiting", flush=True)
waits_for_go(sys.argv[1])
