"""Option parsing, cluster resolution and dataset files: no TensorFlow needed."""

import gzip
import hashlib
import http.server
import json
import os
import struct
import subprocess
import sys
import threading

import pytest
from needs import require

np = require("numpy", "the train extra")  # noqa: E402 (datasets needs it too)

from launcher.errors import MgpuError, UsageError
from launcher.trainer import cluster, datasets, options
from launcher.host.ports import pick_free_ports
from launching import REPO


def run_module(args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "launcher.trainer", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--global-batch-size", "0"], "must be a positive integer"),
    (["--distribution-strategy", "ps"], "invalid choice"),
    (["--allreduce-dtype", "int8"], "invalid choice"),
    (["--worker-hosts", "a:1,b:2"], "--worker-hosts and --task-index go together"),
    (["--worker-hosts", "a:1,b", "--task-index", "0"], "expected host:port, got 'b'"),
    (["--worker-hosts", "a:1,b:2", "--task-index", "2"], "out of range"),
    (["--global-batch-size", "64", "--batch-size-per-replica", "8"], "not allowed with"),
    (["--stop-at-accuracy", "1.5"], "must be in (0, 1]"),
    (["--train-steps", "\u0663"], "not an integer: '\u0663'"),  # ARABIC-INDIC DIGIT THREE: int() reads it
    (["--stop-at-accuracy", "\u0660.5"], "not a number"),
])
def test_bad_options_exit_2_with_one_line_and_no_tensorflow(poisoned_tensorflow, args, message):
    result = run_module(args, {"PYTHONPATH": poisoned_tensorflow})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mgpu train: error: ") and message in lines[0]


def test_help_answers_without_tensorflow(poisoned_tensorflow):
    result = run_module(["--help"], {"PYTHONPATH": poisoned_tensorflow})
    assert result.returncode == 0, result.stderr
    for option in ("--distribution-strategy", "--allreduce-dtype", "--bytes-per-pack",
                   "--stop-at-accuracy", "--evaluator-timeout", "--export-dir"):
        assert option in result.stdout


def test_main_returns_exit_codes_in_process(capsys):
    from launcher.trainer import main
    assert main(["--train-steps", "-1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_unexpected_errors_are_one_line_and_exit_1(capsys, monkeypatch):
    from launcher.trainer import main

    def broken(*args, **kwargs):
        raise RuntimeError("no cluster today\nsecond line")
    monkeypatch.setattr(cluster, "resolve", broken)
    assert main([]) == 1
    assert capsys.readouterr().err == ("mgpu train: internal error: RuntimeError: no cluster today "
                                       "(run with --debug for the traceback)\n")
    assert main(["--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "in broken" in err
    assert err.splitlines()[-1] == "mgpu train: internal error: RuntimeError: no cluster today"


def test_debug_shows_the_traceback_of_a_usage_error(capsys):
    from launcher.trainer import main
    assert main(["--debug", "--train-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("mgpu train: error: ")
    assert options.parse(["--debug"]).debug and not options.parse([]).debug


def test_options_load_no_cli_and_nothing_of_the_launcher_beyond_the_shared_modules():
    code = ("import sys, launcher.trainer.options, launcher.trainer.cluster\n"
            "print('\\n'.join(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "click" not in loaded and "launcher.cli" not in loaded
    allowed = {"launcher", "launcher.errors", "launcher.protocol", "launcher.config",
               "launcher.config.addresses", "launcher.config.hostlist"}
    launcher_modules = {name for name in loaded if name.split(".")[0] == "launcher"}
    outside = {name for name in launcher_modules
               if name not in allowed and name.split(".")[:2] != ["launcher", "trainer"]}
    assert outside == set()


def test_a_planned_size_that_is_not_a_worker_count_exits_2_in_one_line_before_tensorflow(poisoned_tensorflow):
    result = run_module([], {"PYTHONPATH": poisoned_tensorflow, "MGPU_WORLD_SIZE_MAX": "3\x1b[2J"})
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("mgpu train: error: MGPU_WORLD_SIZE_MAX must be a number of workers from 1 to 1048576, "
                             "not '3\\x1b[2J'\n")


def test_malformed_tf_config_is_a_usage_error(poisoned_tensorflow):
    result = run_module([], {"PYTHONPATH": poisoned_tensorflow, "TF_CONFIG": "{not json"})
    assert result.returncode == 2
    assert "TF_CONFIG is not valid JSON" in result.stderr


def test_worker_hosts_build_tf_config():
    env = {}
    info = cluster.resolve(("h1:1", "h2:2", "h3:3"), 2, environ=env)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["h1:1", "h2:2", "h3:3"]}, "task": {"type": "worker", "index": 2}}
    assert (info.num_workers, info.worker_index, info.is_chief) == (3, 2, False)


def test_worker_hosts_conflict_with_tf_config():
    with pytest.raises(UsageError, match="TF_CONFIG is set"):
        cluster.resolve(("h1:1",), 0, environ={"TF_CONFIG": '{"cluster": {}}'})


def test_no_cluster_is_a_single_chief():
    info = cluster.resolve(None, None, environ={})
    assert (info.num_workers, info.is_chief, info.is_evaluator) == (1, True, False)


@pytest.mark.parametrize("config, expected", [
    ({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "chief", "index": 0}},
     (3, 0, True)),
    ({"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 1}},
     (3, 2, False)),
    ({"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 0}}, (2, 0, True)),
    ({"cluster": {"worker": ["w:1"]}, "task": {"type": "evaluator", "index": 0}}, (1, -1, False)),
])
def test_roles_from_tf_config(config, expected):
    info = cluster.from_tf_config(config)
    assert (info.num_workers, info.worker_index, info.is_chief) == expected


@pytest.mark.parametrize("config, message", [
    ({"cluster": {"worker": ["w:1"]}, "task": {"type": "ps", "index": 0}}, "chief, worker or evaluator"),
    ({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 1}}, "not in the cluster"),
    ({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}, "at most one chief"),
    ({"task": {"type": "worker", "index": 0}}, '"cluster" and "task"'),
])
def test_bad_tf_config(config, message):
    with pytest.raises(UsageError, match=message):
        cluster.from_tf_config(config)


@pytest.mark.parametrize("requested, workers, gpus, expected", [
    ("auto", 1, 0, "default"),
    ("auto", 1, 1, "default"),
    ("auto", 1, 4, "mirrored"),
    ("auto", 2, 0, "multi_worker_mirrored"),
    ("auto", 3, 8, "multi_worker_mirrored"),
    ("off", 1, 4, "default"),
    ("one_device", 1, 2, "one_device"),
    ("mirrored", 1, 2, "mirrored"),
    ("multi_worker_mirrored", 1, 0, "multi_worker_mirrored"),
])
def test_strategy_choice(requested, workers, gpus, expected):
    assert cluster.choose_strategy(requested, workers, gpus) == expected


@pytest.mark.parametrize("requested", ["off", "one_device", "mirrored"])
def test_single_worker_strategy_with_several_workers_is_an_error(requested):
    with pytest.raises(UsageError, match=f"--distribution-strategy {requested} cannot train the 2"):
        cluster.choose_strategy(requested, 2, 0)


@pytest.mark.parametrize("argv, replicas, expected", [
    ([], 3, 3 * options.DEFAULT_BATCH_SIZE_PER_REPLICA),
    (["--batch-size-per-replica", "32"], 4, 128),
    (["--global-batch-size", "256"], 2, 256),
])
def test_global_batch_size(argv, replicas, expected):
    assert options.global_batch_size(options.parse(argv), replicas) == expected


@pytest.mark.parametrize("size, replicas, nearest", [(255, 2, 254), (100, 3, 99), (101, 3, 102), (2, 3, 3)])
def test_indivisible_global_batch_suggests_nearest(size, replicas, nearest):
    opts = options.parse(["--global-batch-size", str(size)])
    with pytest.raises(UsageError, match=f"does not divide among {replicas} replicas; use {nearest}$"):
        options.global_batch_size(opts, replicas)


# --- datasets ---------------------------------------------------------------------------

def idx_bytes(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def small_idx_files(rng) -> dict[str, bytes]:
    return {
        "train-images-idx3-ubyte.gz": idx_bytes(rng.integers(0, 256, (6, 28, 28))),
        "train-labels-idx1-ubyte.gz": idx_bytes(rng.integers(0, 10, (6,))),
        "t10k-images-idx3-ubyte.gz": idx_bytes(rng.integers(0, 256, (4, 28, 28))),
        "t10k-labels-idx1-ubyte.gz": idx_bytes(rng.integers(0, 10, (4,))),
    }


def test_idx_files_from_data_dir(tmp_path):
    rng = np.random.default_rng(0)
    for name, data in small_idx_files(rng).items():
        (tmp_path / name).write_bytes(data)
    arrays = datasets.load("fashion_mnist", str(tmp_path))
    assert arrays.train_images.shape == (6, 28, 28) and arrays.test_labels.shape == (4,)
    assert arrays.train_labels.dtype == np.int32


def test_truncated_idx_file_is_reported(tmp_path):
    (tmp_path / "x.gz").write_bytes(gzip.compress(struct.pack(">BBBBI", 0, 0, 8, 1, 10) + b"abc"))
    with pytest.raises(MgpuError, match="truncated"):
        datasets.read_idx(tmp_path / "x.gz")


def test_missing_files_in_data_dir(tmp_path):
    with pytest.raises(MgpuError, match="lacks train-images-idx3-ubyte.gz"):
        datasets.load("mnist", str(tmp_path))


@pytest.fixture
def file_server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www."""
    root = tmp_path / "www"
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_download_verifies_and_caches(tmp_path, file_server, monkeypatch):
    root, url = file_server
    files = small_idx_files(np.random.default_rng(1))
    for name, data in files.items():
        (root / name).write_bytes(data)
    sums = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    monkeypatch.setitem(datasets.SOURCES, "mnist", (url, sums))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    arrays = datasets.load("mnist", None)
    assert arrays.train_images.shape == (6, 28, 28)
    cached = tmp_path / "cache" / "mgpu" / "datasets" / "mnist"
    assert sorted(p.name for p in cached.iterdir()) == sorted(files)
    # Cached now: works with the server's files gone.
    for name in files:
        (root / name).unlink()
    assert datasets.load("mnist", None).test_labels.shape == (4,)


def test_download_with_wrong_checksum_keeps_nothing(tmp_path, file_server, monkeypatch):
    root, url = file_server
    for name, data in small_idx_files(np.random.default_rng(2)).items():
        (root / name).write_bytes(data)
    monkeypatch.setitem(datasets.SOURCES, "mnist", (url, {n: "0" * 64 for n in datasets.FILES}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(MgpuError, match="checksum mismatch"):
        datasets.load("mnist", None)
    assert list((tmp_path / "cache" / "mgpu" / "datasets" / "mnist").iterdir()) == []


def test_offline_and_uncached_says_use_data_dir(tmp_path, monkeypatch):
    closed_port = pick_free_ports(1)[0]
    _, sums = datasets.SOURCES["fashion_mnist"]
    monkeypatch.setitem(datasets.SOURCES, "fashion_mnist", (f"http://127.0.0.1:{closed_port}/", sums))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(MgpuError, match="pass --data-dir") as info:
        datasets.load("fashion_mnist", None)
    assert "\n" not in str(info.value)


def test_synthetic_data_is_the_same_everywhere_and_class_dependent():
    a, b = datasets.synthetic(2000, 10), datasets.synthetic(2000, 10)
    assert np.array_equal(a.train_images, b.train_images)
    # Class means differ far more than the noise of a mean over ~200 images.
    means = np.stack([a.train_images[a.train_labels == c].mean(axis=0) for c in range(10)])
    assert np.abs(means[0] - means[1]).mean() > 5


def test_evaluator_without_model_dir_is_a_usage_error(poisoned_tensorflow):
    config = {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "evaluator", "index": 0}}
    result = run_module([], {"PYTHONPATH": poisoned_tensorflow, "TF_CONFIG": json.dumps(config)})
    assert result.returncode == 2
    assert result.stderr.strip() == "mgpu train: error: an evaluator task needs --model-dir"


def test_single_worker_strategy_in_a_cluster_fails_before_tensorflow(poisoned_tensorflow):
    config = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
              "task": {"type": "worker", "index": 1}}
    result = run_module(["--distribution-strategy", "off"],
                        {"PYTHONPATH": poisoned_tensorflow, "TF_CONFIG": json.dumps(config)})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mgpu train: error: --distribution-strategy off cannot train the 2 workers in TF_CONFIG; "
        "use multi_worker_mirrored or auto")


def test_output_dirs_others_could_plant_links_in_are_refused_before_tensorflow(poisoned_tensorflow, tmp_path):
    """TensorFlow writes checkpoints and exports through paths: a folder another user made, or
    may write, could redirect them."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)  # nobody
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cases = [(["--export-dir", str(shared)], f"--export-dir {shared}: writable by other users")]
    if os.geteuid() == 0:
        cases.append((["--model-dir", str(theirs)], f"--model-dir {theirs}: owned by"))
    for args, message in cases:
        result = run_module(["--train-steps", "1", *args], {"PYTHONPATH": poisoned_tensorflow})
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [result.stderr.strip()] and message in result.stderr, result.stderr
    made = tmp_path / "new" / "run1"
    result = run_module(["--train-steps", "1", "--model-dir", str(made)], {"PYTHONPATH": poisoned_tensorflow})
    assert made.is_dir() and oct(made.stat().st_mode & 0o777) == oct(0o755)
    assert "numpy must not be imported here" in result.stderr  # the check passed: on to loading the data
