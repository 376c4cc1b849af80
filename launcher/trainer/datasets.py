"""Image datasets as numpy arrays: MNIST-format IDX files, downloads, and synthetic data."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pathlib
import struct
import tempfile
import urllib.error
import urllib.request

import numpy as np

from launcher.errors import MgpuError

FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

# Upstream locations and the SHA256 of each upstream file.
SOURCES = {
    "mnist": ("https://ossci-datasets.s3.amazonaws.com/mnist/", {
        "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaaee4ad3a1328fbe3",
    }),
    "fashion_mnist": ("https://storage.googleapis.com/tensorflow/tf-keras-datasets/", {
        "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    }),
}

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)
SYNTHETIC_TRAIN_EXAMPLES = 20000
SYNTHETIC_TEST_EXAMPLES = 2000
PATTERN_LEVELS = 64  # a synthetic image is its class's pattern (0-64) plus noise (0-191)
NOISE_LEVELS = 256 - PATTERN_LEVELS
DOWNLOAD_TIMEOUT_S = 60


class DatasetError(MgpuError):
    """Dataset files missing, unreadable or corrupt."""


@dataclasses.dataclass(frozen=True)
class Arrays:
    train_images: np.ndarray  # uint8 (N, 28, 28)
    train_labels: np.ndarray  # int32 (N,)
    test_images: np.ndarray
    test_labels: np.ndarray


def load(name: str, data_dir: str | None) -> Arrays:
    if name == "synthetic":
        return synthetic()
    directory = pathlib.Path(data_dir) if data_dir else _cached(name)
    missing = [f for f in FILES if not (directory / f).is_file()]
    if missing:
        raise DatasetError(f"{directory} lacks {', '.join(missing)}")
    return Arrays(
        train_images=read_idx(directory / FILES[0]),
        train_labels=read_idx(directory / FILES[1]).astype(np.int32),
        test_images=read_idx(directory / FILES[2]),
        test_labels=read_idx(directory / FILES[3]).astype(np.int32),
    )


def read_idx(path: pathlib.Path) -> np.ndarray:
    """Read a gzipped IDX file of unsigned bytes (the MNIST format)."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise DatasetError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) - header != int(np.prod(shape)):
        raise DatasetError(f"{path} is truncated")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def cache_dir(name: str) -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "mgpu" / "datasets" / name


def _cached(name: str) -> pathlib.Path:
    """The cache directory, after downloading and verifying what it lacks."""
    directory = cache_dir(name)
    base_url, checksums = SOURCES[name]
    for filename in FILES:
        target = directory / filename
        if target.is_file():
            continue
        directory.mkdir(parents=True, exist_ok=True)
        _download(base_url + filename, target, checksums[filename])
    return directory


def _download(url: str, target: pathlib.Path, sha256: str) -> None:
    # Download beside the target and rename: concurrent workers never see a partial file.
    fd, partial = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                    while chunk := response.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise DatasetError(
                    f"cannot download {url} ({reason}); pass --data-dir with the four IDX .gz files"
                ) from None
        if digest.hexdigest() != sha256:
            raise DatasetError(f"checksum mismatch for {url}: got {digest.hexdigest()}, want {sha256}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def synthetic(num_train: int = SYNTHETIC_TRAIN_EXAMPLES, num_test: int = SYNTHETIC_TEST_EXAMPLES,
              seed: int = 1234) -> Arrays:
    """Learnable images: one fixed blurry pattern per class, faded into strong noise.

    The seed is fixed, so every worker builds the same arrays without exchanging them.
    """
    rng = np.random.default_rng(seed)
    coarse = rng.random((NUM_CLASSES, 7, 7))
    # (10, 28, 28), blocky class templates, a quarter of the pixel range: 0-64.
    patterns = np.round(np.kron(coarse, np.ones((4, 4))) * PATTERN_LEVELS).astype(np.uint8)

    def make(n):
        labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
        # Drawn as bytes and added as bytes (64 + 191 fits): in floating point the same images
        # would take 1 CPU-s and four 140 MB temporaries at every start of every task.
        noise = rng.integers(0, NOISE_LEVELS, size=(n, *IMAGE_SHAPE), dtype=np.uint8)
        return patterns[labels] + noise, labels

    train_images, train_labels = make(num_train)
    test_images, test_labels = make(num_test)
    return Arrays(train_images, train_labels, test_images, test_labels)
