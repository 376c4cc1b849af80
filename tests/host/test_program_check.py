"""The probe's look at a task's own program (host/probe/program_check.py), run here with this
machine's Python: the modules a script imports at its top level, those it cannot find, and what
this host's own name resolves to; and how a Python command line names its script or module."""

import os
import sys

from launcher.host.probe.program_check import own_name_check, program_check
from launcher.preflight.probes import python_program

SCRIPT = """\
from __future__ import annotations
import os, json.decoder
from mgpu_absent_framework.nn import Module
from . import sibling_module
if __name__ == "__main__":
    import mgpu_absent_under_main
try:
    import mgpu_optional_extra
except ImportError:
    mgpu_optional_extra = None
def later():
    import mgpu_absent_in_a_function
import local_helper
"""


def test_a_scripts_top_level_imports_are_looked_up_without_importing_them(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "local_helper.py").write_text("raise SystemExit('imported')\n")  # found beside the script, never run
    found = program_check(str(script))
    assert found["executable"] == os.path.abspath(sys.executable)
    assert found["imports"] == ["os", "json", "mgpu_absent_framework", "mgpu_absent_under_main",
                                        "local_helper"]
    assert found["imports_missing"] == ["mgpu_absent_framework", "mgpu_absent_under_main"]


def test_a_module_run_with_dash_m_and_a_script_that_does_not_parse(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert program_check(module="mgpu_absent_package.main")["imports_missing"] == ["mgpu_absent_package"]
    assert program_check(module="json.tool")["imports_missing"] == []
    broken = tmp_path / "broken.py"
    broken.write_text("import (\n")
    assert "imports" not in program_check(str(broken))  # Python itself says why when the task starts


def test_a_python_command_lines_script_or_module():
    assert python_program(("python3", "-u", "-X", "dev", "train.py", "--epochs", "1")) == ("train.py", None)
    assert python_program(("python3", "-m", "torch.distributed.run", "x.py")) == (None, "torch.distributed.run")
    assert python_program(("python3", "-mpkg")) == (None, "pkg")
    assert python_program(("python3", "-c", "import torch")) == (None, None)
    assert python_program(("python3",)) == (None, None)


def test_the_hosts_own_name_and_its_addresses():
    found = own_name_check()
    assert found["own_name"] and found["own_addresses"] or found["own_name_error"]


def test_the_keras_backend_a_script_sets_for_itself(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text('import os\nos.environ["KERAS_BACKEND"] = "jax"\nimport keras\n')
    assert program_check(str(script))["keras_backend"] == "jax"
    script.write_text('import os\nos.environ.setdefault("KERAS_BACKEND", "torch")\nimport keras\n')
    assert program_check(str(script))["keras_backend"] == "torch"
    script.write_text("import keras\n")
    assert "keras_backend" not in program_check(str(script))
