"""A task's process tree as the supervisor sees it (host/proctree.py's descendants)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from launcher.host import proctree
from launching import wait_for

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

