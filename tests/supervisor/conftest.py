"""Fixtures for supervisor tests. Helpers live in supervisor_helpers.py (importable: see below)."""

import pathlib
import sys
import uuid

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # for `import supervisor_helpers`

from launcher.host import proctree  # noqa: E402


@pytest.fixture
def run_id():
    """A fresh run id; whatever still carries it at the end is killed (and the test fails)."""
    rid = f"test-{uuid.uuid4().hex[:12]}"
    yield rid
    leftovers = proctree.tagged_processes(rid)
    proctree.send(leftovers, 9)
    assert not leftovers, f"processes of {rid} left behind: {[p.pid for p in leftovers]}"


@pytest.fixture
def record_dir(tmp_path):
    path = tmp_path / "records"
    path.mkdir()
    return path


