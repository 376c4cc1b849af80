"""A task whose child starts a session of its own (os.setsid), as a daemonising helper does; both
then wait, each in a function of its own, until the file argv[1] exists (at most 120 s): what
`mgpu stacks` finds them doing. Each prints a line once it waits."""

import os
import subprocess
import sys
import time


def wait_for(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def child_in_its_own_session(path):
    os.setsid()
    print("child waiting", flush=True)
    wait_for(path)


def parent_waits_for_go(path):
    child = subprocess.Popen([sys.executable, __file__, path, "--child"])
    print("parent waiting", flush=True)
    wait_for(path)
    child.wait(timeout=30)


if sys.argv[2:] == ["--child"]:
    child_in_its_own_session(sys.argv[1])
else:
    parent_waits_for_go(sys.argv[1])
