"""Which version of a Python distribution is installed, read from its package metadata without
importing it (nor importlib.metadata).

Standard library only, importing nothing of mgpu: the probe (launcher/host/probe/) ships this
source to every host, and the launcher reads this machine's TensorFlow version with it, so the
versions compared are read the same way.
"""

import os
import re
import sys

# The names TensorFlow is installed under.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tensorflow-macos",
                            "intel-tensorflow")


def _distribution_key(name):
    """A distribution's name as installers spell it in their metadata folders (PEP 503, then
    `-` as `_`): "tensorflow-cpu", "Tensorflow_CPU" and "tensorflow.cpu" are one."""
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_version(names, path=None):
    """The version of the first of `names` (distributions) installed on `path` (sys.path), from its
    metadata folder (NAME-VERSION.dist-info or .egg-info), as importlib.metadata finds it, without
    importing importlib.metadata: that import alone (email, zipfile, csv) costs a probe more than
    the rest of the host check when TensorFlow is not imported. None when none is installed."""
    folders = []
    for entry in sys.path if path is None else path:
        try:
            folders.append((entry or ".", os.listdir(entry or ".")))
        except OSError:  # not a folder (a zip), or gone
            continue
    for name in names:
        wanted = _distribution_key(name)
        for entry, listing in folders:
            for folder in listing:
                stem, _, kind = folder.rpartition(".")
                if kind not in ("dist-info", "egg-info") or _distribution_key(stem.split("-")[0]) != wanted:
                    continue
                version = _metadata_version(os.path.join(entry, folder), "METADATA" if kind == "dist-info" else "PKG-INFO")
                if version:
                    return version
    return None


def _metadata_version(folder, file_name):
    """The Version field of a metadata folder's METADATA (or PKG-INFO, or the folder itself where an
    .egg-info is one file), None if unreadable."""
    target = os.path.join(folder, file_name) if os.path.isdir(folder) else folder
    try:
        with open(target, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():  # the headers end at the first empty line
                    break
    except OSError:
        pass
    return None


NOT_INSTALLED = "not installed"  # tensorflow_error or tf_keras_error where no package metadata names the package


def installed_tensorflow_version():
    """TensorFlow's version from package metadata (without importing it), or None."""
    return installed_version(TENSORFLOW_DISTRIBUTIONS)
