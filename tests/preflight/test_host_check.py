"""The host check's TensorFlow: read from package metadata before a launch, imported by `mgpu check`.

A launch of the built-in trainer would otherwise import TensorFlow twice at every start on every
host, once in the check and once in the task (seconds each, more with CUDA); `mgpu check`, run to
vet a cluster, imports it so that an installation that is there but broken is found too. The
check runs its real probe here in a subprocess, with a `tensorflow` first on the path that raises
on import.
"""

import dataclasses
import sys

import pytest

from launcher.plan.planner import LEGACY_KERAS_ENV, TRAINER_MODULE
from launcher.preflight.check import check_hosts_and_reach, local_tensorflow_version
from supervisor_helpers import make_plans

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def trainer_plan(run_id):
    [plan] = make_plans(run_id, [], workers=1)
    return dataclasses.replace(plan, argv=(sys.executable, "-m", TRAINER_MODULE))


def test_before_a_launch_tensorflow_is_not_imported_and_its_version_is_read(trainer_plan, poisoned_tensorflow,
                                                                            monkeypatch):
    monkeypatch.setenv("PYTHONPATH", poisoned_tensorflow)
    [report], _, _ = check_hosts_and_reach([trainer_plan], [])
    assert report.ok, report.problems
    assert report.tensorflow == local_tensorflow_version() is not None


def test_mgpu_check_imports_it_and_names_the_error(trainer_plan, poisoned_tensorflow, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", poisoned_tensorflow)
    [report], _, _ = check_hosts_and_reach([trainer_plan], [], import_tensorflow=True)
    assert report.problems == ["tensorflow does not import: tensorflow must not be imported here"]


def test_a_host_without_tensorflow_or_tf_keras_is_told_they_are_not_installed(trainer_plan, tmp_path, monkeypatch):
    """The tasks' Python runs without its site-packages (-S): no package metadata on its path."""
    python = tmp_path / "python-without-site"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    plan = dataclasses.replace(trainer_plan, argv=(str(python), "-m", TRAINER_MODULE),
                               env={**trainer_plan.env, LEGACY_KERAS_ENV: "1"})
    monkeypatch.setenv("PYTHONPATH", "")
    [report], _, _ = check_hosts_and_reach([plan], [])
    assert "tensorflow is not installed" in report.problems, report.problems
    assert [p for p in report.problems if p.startswith("tf_keras is not installed (--legacy-keras needs it): pip install")]
