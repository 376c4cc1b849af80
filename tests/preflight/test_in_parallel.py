"""The checks' threads (preflight/on_host.py's in_parallel) and Ctrl-C."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The job hands SIGINT to its own thread, not to the main one: so does the kernel, now and then,
# with a Ctrl-C (to another thread whenever the main thread has a signal pending already).
PROGRAM = """
import signal, sys, threading, time
from launcher.preflight.on_host import in_parallel

MAIN = threading.main_thread().native_id

def job():
    # Once the main thread has waited in a futex (the join) for a second on end: a signal that came
    # while it still ran Python would interrupt it anyway.
    waiting = 0
    for _ in range(600):
        with open(f"/proc/self/task/{MAIN}/wchan") as f:
            waiting = waiting + 1 if f.read().startswith("futex") else 0
        if waiting == 10:
            break
        time.sleep(0.1)
    else:
        print("the main thread never waited", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    time.sleep(600)

try:
    in_parallel([job], 1)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_taken_by_a_job_thread_still_interrupts_the_wait():
    """Ctrl-C while the checks wait out a long timeout returns at once, whichever thread took it."""
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=120)  # the jobs would wait 600 s
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == 130, err.decode()
    assert out.decode() == "interrupted\n"


def test_results_come_in_order_and_a_jobs_error_is_raised_in_the_caller():
    from launcher.preflight.on_host import in_parallel
    assert in_parallel([lambda i=i: i * i for i in range(5)], 2) == [0, 1, 4, 9, 16]
    try:
        in_parallel([lambda: 1, lambda: 1 / 0], 2)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the job's error was not raised")
