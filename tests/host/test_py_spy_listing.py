"""The processes py-spy reads of a task over SSH, listed on its host by the shell as a task on this
machine is read: its process group and every descendant by parent pid, a child that started a
session of its own included. Run here on a real tree: a group leader and its setsid child."""

import os
import pathlib
import signal
import subprocess
import sys

from launching import wait_for
from launcher.host import py_spy

SETSID_CHILD = pathlib.Path(__file__).parents[1] / "programs" / "setsid_child.py"


def listed(pgid: int) -> list[int]:
    done = subprocess.run(["/bin/sh", "-c", py_spy.listing_of_tree(pgid)], capture_output=True, text=True, timeout=30)
    return [int(word) for word in done.stdout.split()]


def test_a_task_tree_includes_a_child_in_a_session_of_its_own(tmp_path):
    go = tmp_path / "go"
    leader = subprocess.Popen([sys.executable, str(SETSID_CHILD), str(go)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        lines = [leader.stdout.readline(), leader.stdout.readline()]
        assert sorted(lines) == ["child waiting\n", "parent waiting\n"]
        tree = listed(leader.pid)
        assert tree[0] == leader.pid and len(tree) == 2, tree
        child = tree[1]
        assert os.getpgid(child) == child != leader.pid  # not in the task's group: pgrep -g misses it
        assert listed(child) == [child]
    finally:
        go.touch()
        try:
            leader.wait(timeout=30)
        finally:
            if leader.poll() is None:
                os.killpg(leader.pid, signal.SIGKILL)
                leader.wait()
            leader.stdout.close()
    wait_for(lambda: not listed(leader.pid), 10, "the tree gone")
