"""`mgpu check --legacy-keras` and the launch preflight: every host needs tf_keras of its TensorFlow's series."""

import os
import sys

import pytest
from needs import installed_version

from launcher.host.ports import pick_free_ports
from launching import REPO, mgpu_env, run_mgpu

pytestmark = pytest.mark.slow

TF_VERSION = installed_version("tensorflow", "the train extra")
SERIES = ".".join(TF_VERSION.split(".")[:2])


def mgpu(args, tmp_path, shadow=None, shadow_version=None):
    """mgpu with, if `shadow` is given, a tf_keras package of that source first on the path, and
    with `shadow_version`, its package metadata of that version."""
    path = [str(REPO)]
    if shadow is not None:
        package = tmp_path / "shadow" / "tf_keras"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(shadow)
        path.insert(0, str(package.parent))
        if shadow_version is not None:
            metadata = package.parent / f"tf_keras-{shadow_version}.dist-info"
            metadata.mkdir()
            (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tf-keras\nVersion: {shadow_version}\n")
    return run_mgpu(*args, cwd=tmp_path, env=mgpu_env(PYTHONPATH=os.pathsep.join(path), HOME=str(tmp_path)),
                    timeout=240)


def workers():
    return ",".join(f"127.0.0.1:{port}" for port in pick_free_ports(2))


def test_check_shows_tf_keras_of_every_host(tmp_path):
    done = mgpu(["check", "--workers", workers(), "--legacy-keras", "--", sys.executable, "train.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()
    assert header.split()[4:6] == ["TENSORFLOW", "TF_KERAS"]
    assert row.split()[4:6] == [TF_VERSION, installed_version("tf-keras", "the legacy-keras extra")]


def test_check_names_the_pip_command_when_tf_keras_is_missing(tmp_path):
    done = mgpu(["check", "--workers", workers(), "--legacy-keras", "--", sys.executable, "train.py"], tmp_path,
                shadow="raise ModuleNotFoundError(\"No module named 'tf_keras'\")\n")
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[1].split()[5] == "missing"
    assert done.stderr.strip() == (f"mgpu: error: check failed on 127.0.0.1: tf_keras does not import "
                                   f"(--legacy-keras needs it): pip install 'tf-keras~={SERIES}.0'")


def test_launch_refuses_a_tf_keras_of_another_series_before_starting(tmp_path):
    """Read from the package metadata: the check before a launch imports neither tf_keras nor TensorFlow."""
    done = mgpu(["launch", "--local", "2", "--legacy-keras", "--run-id", "mismatch", "--", sys.executable, "-c",
                 "open('started', 'w')"], tmp_path, shadow="raise ImportError('tf_keras must not be imported here')\n",
                shadow_version="2.15.1")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"mgpu: error: check failed on 127.0.0.1: tf_keras 2.15.1 does not match tensorflow {TF_VERSION} "
                    f"(--legacy-keras): pip install 'tf-keras~={SERIES}.0'")
    assert not (tmp_path / "started").exists()


def test_check_names_a_tensorflow_other_than_this_machines(tmp_path):
    """A host whose Python has another TensorFlow installed than the launcher's machine: named in one line.
    The check reads the version from the package's metadata (it imports TensorFlow only for tasks
    that need it), so the shadow installation has both."""
    shadow = tmp_path / "shadow" / "tensorflow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("__version__ = '2.15.1'\n")
    metadata = shadow.parent / "tensorflow-2.15.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.15.1\n")
    # The tasks' Python (the host's) sees the shadow installation; the launcher's does not.
    python = tmp_path / "python3-with-shadow"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent}{os.pathsep}$PYTHONPATH exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    env = mgpu_env(HOME=str(tmp_path))
    done = run_mgpu("check", "--workers", workers(), "--", str(python), "train.py", cwd=tmp_path, env=env,
                    timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[1].split()[4] == "2.15.1"
    assert done.stderr.strip() == (f"mgpu: error: check failed on 127.0.0.1: tensorflow 2.15.1 differs from "
                                   f"{TF_VERSION} on this machine")
