"""`require(module)`: what a test needs that only an optional extra installs (TensorFlow, JAX, torch,
kubernetes-validate...).

Without it the test skips, except on CI (CI=true, or MGPU_REQUIRE_SSHD=1 as .ci/run sets), where
every extra is installed and its absence is a failure, not a skip nobody reads. Called at module
level it skips (or fails) the whole module.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import types

import pytest

ON_CI = os.environ.get("CI", "").lower() == "true" or os.environ.get("MGPU_REQUIRE_SSHD") == "1"
# Set where the fast tests run while the frameworks are being installed into the venv
# (tests/install_beside_tests.py): a module found then may be half written, so none is imported,
# and what needs one skips, on CI too: the rest of the suite runs once they are installed.
WHILE_INSTALLING = os.environ.get("MGPU_TESTS_WHILE_INSTALLING") == "1"
BEING_INSTALLED = ("tensorflow", "tf_keras", "keras", "jax", "jaxlib", "torch", "lightning", "pytorch_lightning",
                   "numpy", "tensorboard", "tensorboardX")


COLLECTED = False  # set by conftest.py once collection is over


def _being_installed(name: str) -> bool:
    return WHILE_INSTALLING and name.replace("-", "_").split(".")[0] in BEING_INSTALLED


def _not_yet(name: str) -> None:
    """A module that needs `name` skips until the rest of the suite runs it; a test marked fast that
    does would run in neither part: it fails."""
    if COLLECTED:
        pytest.fail(f"a fast test needs {name}: mark it slow, or require() it at module level", pytrace=False)
    pytest.skip(f"needs {name}, which is being installed", allow_module_level=True)


def missing(reason: str) -> None:
    """Skip the test, or fail it on CI."""
    if ON_CI:
        pytest.fail(f"{reason}; CI (CI=true or MGPU_REQUIRE_SSHD=1) runs every test", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def root(*tools: str) -> None:
    """For a test that acts as root (another user's files, setpriv, namespaces): skip as another
    user, or without `tools`, except on CI (which runs as root with them), where it fails."""
    if os.geteuid() != 0:
        missing("needs root")
    absent = [tool for tool in tools if shutil.which(tool) is None]
    if absent:
        missing(f"needs {', '.join(absent)}")


def require(module: str, extra: str = "the dev extra") -> types.ModuleType:
    """Import `module` and return it; skip without it, fail on CI."""
    if _being_installed(module):
        _not_yet(module)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"needs {module} ({extra}): {e}")


def installed_version(distribution: str, extra: str = "the dev extra") -> str:
    """The version of an installed distribution, read without importing it; skip without it, fail on CI."""
    if _being_installed(distribution):
        _not_yet(distribution)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        missing(f"needs {distribution} installed ({extra})")


def stand_in(folder, name: str, loaded, *, submodules=(), importable: bool = True) -> str:
    """A folder for the front of PYTHONPATH where a process finds, in place of package `name` (with
    empty `submodules`), a stand-in that leaves the file `loaded` when imported: the proof that a
    program did not import it. A stand-in that is not `importable` then raises ImportError, as if
    the package were absent."""
    package = folder / "stand-ins" / name
    package.mkdir(parents=True, exist_ok=True)
    raising = "" if importable else f"raise ImportError('{name}: a stand-in')\n"
    (package / "__init__.py").write_text(f"open({str(loaded)!r}, 'w').close()\n{raising}")
    for submodule in submodules:
        (package / f"{submodule}.py").write_text("")
    return str(package.parent)
