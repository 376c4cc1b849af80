"""A task's process tree as the supervisor sees it (host/proctree.py's descendants)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from launcher import protocol
from launcher.host import proctree
from launching import wait_for
from pid_reuse import start_with_pid

# A shell with a child, a grandchild in a subshell, and a Python whose second thread starts a child:
# Linux lists that one under the thread, not the process.
TREE = ("sleep 600 & (sleep 601 & wait) & "
        f"{sys.executable} -c 'import subprocess, threading; "
        "t = threading.Thread(target=subprocess.run, args=([\"sleep\", \"602\"],)); t.start(); t.join()' & wait")


def test_the_tree_is_every_descendant_psutil_finds_and_no_other_process():
    shell = subprocess.Popen(["sh", "-c", TREE])
    root = psutil.Process(shell.pid)
    try:
        wait_for(lambda: len(root.children(recursive=True)) == 5, 60, what="the tree started")
        found = proctree.descendants(root)
        assert sorted(p.pid for p in found) == sorted(p.pid for p in root.children(recursive=True))
        assert sorted(" ".join(p.cmdline()[:2]) for p in found if p.name() == "sleep") == [
            "sleep 600", "sleep 601", "sleep 602"]
    finally:
        proctree.send([root, *root.children(recursive=True)], 9)
        shell.wait(10)
    assert proctree.descendants(root) == []



def test_a_run_process_on_a_pid_an_earlier_scan_saw_under_another_program_is_found():
    # A supervisor scans for its run's processes again and again, for days; meanwhile the kernel
    # hands the pids of ended programs out again, to the run's own processes among others.
    run_id = "test-pid-again"
    waiting = [sys.executable, "-c", "import sys; print('started', flush=True); sys.stdin.read()"]
    other = subprocess.Popen(waiting, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    # Its start-up (tens of ms) parts the two programs' start times, which psutil tells apart to 10 ms.
    assert other.stdout.readline() == b"started\n"
    assert proctree.tagged_processes(run_id) == []  # this scan saw `other`
    other.kill()
    other.wait()
    ours = start_with_pid(other.pid, waiting, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          env={**os.environ, protocol.ENV_RUN_ID: run_id})
    try:
        assert [p.pid for p in proctree.tagged_processes(run_id)] == [ours.pid]
        proctree.send(proctree.tagged_processes(run_id), signal.SIGKILL)
        assert ours.wait(10) == -signal.SIGKILL
    finally:
        ours.kill()
        ours.wait()
