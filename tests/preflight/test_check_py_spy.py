"""`mgpu check` says where `mgpu stacks` finds no py-spy (a note, not a failure)."""

import json
import os
import shutil
import sys

import pytest

import launching
import needs


def test_check_notes_a_host_whose_tasks_python_has_no_py_spy_and_not_one_that_has(tmp_path):
    needs.installed_version("py-spy")
    bare = "/usr/bin/python3"  # a Python without py-spy beside it
    if not os.access(bare, os.X_OK) or os.path.exists("/usr/bin/py-spy") or shutil.which("py-spy"):
        pytest.skip("needs /usr/bin/python3 without py-spy on PATH")
    port = launching.free_port()
    without = launching.run_mgpu("check", "--workers", f"localhost:{port}", "--", bare, "-c", "pass", timeout=60)
    assert without.returncode == 0, without.stderr
    assert ("mgpu: note: no py-spy on localhost: `mgpu stacks` cannot read its tasks, and a stall asks them for "
            "their stacks with SIGABRT (pip install py-spy, with the tasks' Python or on PATH)") in without.stderr
    found = launching.run_mgpu("check", "--workers", f"localhost:{port}", "--json", "--", sys.executable, "-c", "pass",
                               timeout=60)
    assert found.returncode == 0 and "no py-spy" not in found.stderr, found.stderr
    assert json.loads(found.stdout)["hosts"][0]["py_spy"] == os.path.join(os.path.dirname(sys.executable), "py-spy")
