"""Fixtures shared by every test folder."""

import pytest


@pytest.fixture
def poisoned_tensorflow(tmp_path):
    """A PYTHONPATH whose `tensorflow`, `keras`, `jax` and `numpy` raise on import: put it first to
    prove a program never imports them."""
    for name in ("tensorflow", "keras", "jax", "numpy"):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return str(tmp_path)
