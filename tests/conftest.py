"""Fixtures shared by every test folder."""

import collections
import functools
import inspect
import json
import os
import pathlib
import re
import signal
import sys
import uuid

import pytest
from click.testing import CliRunner

from launcher.cli import cli

# For the helpers every folder shares: `from needs import require`, `import supervisor_helpers`.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from launcher.host import proctree  # noqa: E402
import needs  # noqa: E402

if needs.WHILE_INSTALLING:  # an import of one fails at once, as if it were not installed
    for _name in needs.BEING_INSTALLED:
        sys.modules.setdefault(_name, None)


# A shell without job control starts its background commands with SIGINT and SIGQUIT ignored, and
# what ignores a signal passes that on to every program it starts: the Ctrl-C tests' mgpu would then
# never see theirs. What these tests start gets the defaults, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

# A handler left set to "ignore" (or a signal left blocked) by launcher code run in the test process
# passes to every process the later tests start: a Ctrl-C test would then wait in vain.
_WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE)


@pytest.fixture(scope="session", autouse=True)
def _programs_environment(tmp_path_factory):
    """What the programs the tests start get in their environment, for the whole session:
    - TMPDIR: what they leave in the temporary folder (TensorFlow's autograph keeps a source file per
      converted function, a thousand and more a run) goes under pytest's own base folder, which
      pytest removes after a few runs, not into /tmp for good;
    - JAX's persistent compilation cache: the JAX programs (Keras 3 on JAX, JAX itself) keep what XLA
      compiles in one folder per test process and load it in the next process that compiles the
      same thing, about 3 CPU-s of each such process's 6 and nothing a test looks at (compilations
      under a second are kept too: JAX keeps only longer ones unless told). Tasks on SSH hosts do
      not get it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp_path_factory.mktemp("programs-tmp", numbered=True)))
        patch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax-compilation-cache", numbered=False)))
        patch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        yield


@pytest.fixture(autouse=True)
def _state_of_its_own(tmp_path_factory, monkeypatch):
    """Each test's launches keep their quarantine of hosts (XDG_STATE_HOME) in a folder of the
    test's own: a host one test's run left out is not avoided by the next test's run, nor the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state", numbered=True)))


@pytest.fixture(autouse=True)
def _signals_left_as_found():
    """Fails the test that leaves this process's signal handlers or mask changed, and restores them."""
    handlers = {signum: signal.getsignal(signum) for signum in _WATCHED_SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = [signal.Signals(signum).name for signum, handler in handlers.items() if signal.getsignal(signum) != handler]
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    if signal.pthread_sigmask(signal.SIG_SETMASK, mask) != mask:
        changed.append("the signal mask")
    assert not changed, f"the test left {', '.join(changed)} changed in the test process"


@pytest.fixture
def poisoned_tensorflow(tmp_path):
    """A PYTHONPATH whose `tensorflow`, `keras`, `jax` and `numpy` raise on import: put it first to
    prove a program never imports them."""
    for name in ("tensorflow", "keras", "jax", "numpy"):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text(f"raise ImportError('{name} must not be imported here')\n")
    return str(tmp_path)


@pytest.fixture
def gpus_on_path(tmp_path):
    """A PATH whose nvidia-smi lists `count` GPUs, as `nvidia-smi -L` does."""

    def make(count):
        bin_dir = tmp_path / f"bin{count}"
        bin_dir.mkdir(exist_ok=True)
        listing = "".join(f"echo 'GPU {i}: NVIDIA A100 (UUID: GPU-{i:04d})'\n" for i in range(count))
        script = bin_dir / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + listing)
        script.chmod(0o755)
        return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    return make


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


class Result:
    def __init__(self, result):
        self.exit_code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def mgpu():
    """Run `mgpu ARGS...` in-process through click's CliRunner, with stdout and stderr apart."""

    def run(*args, env=None):
        return Result(CliRunner().invoke(cli, list(args), env=env))

    return run


# The pure parts, tested without TensorFlow, JAX, torch or numpy and without servers: `make test-fast`
# (`pytest -m fast`) runs them in seconds, beside the real-process tests. A test in these places is
# fast unless it is marked slow, ssh or netns, or it or its module imports a framework (or require()s
# one, see needs.py).
FAST = ("tests/cli/", "tests/config/", "tests/plan/", "tests/docs/", "tests/trainer/test_schedule.py",
        "tests/trainer/test_exchange_cost.py", "tests/supervise/test_diagnosis.py", "tests/supervise/test_stacks.py",
        "tests/supervise/test_output_reader.py", "tests/supervise/test_policy_attempt.py",
        "tests/supervise/test_policy_restarts.py", "tests/supervise/test_summary.py",
        "tests/supervise/test_runs.py", "tests/preflight/test_slow_hosts.py", "tests/supervise/test_pace.py",
        "tests/host/test_package_metadata.py", "tests/preflight/test_in_parallel.py",
        "tests/trainer/test_outdirs.py", "tests/trainer/test_planned_size.py", "tests/supervise/test_signals.py", "tests/supervise/test_lost_hosts_policy.py",
        "tests/supervise/test_min_hosts_policy.py", "tests/supervise/test_rejoin_policy.py",
        "tests/fleet/", "tests/report/test_report_page.py", "tests/report/test_report_command.py",
        "tests/supervise/test_exit_codes_policy.py")
NOT_FAST_MARKS = ("slow", "ssh", "netns")
FRAMEWORKS = "tensorflow|tf[_-]keras|keras|jax|jaxlib|torch|numpy"
USES_A_FRAMEWORK = rf"(?:import|from)\s+(?:{FRAMEWORKS})\b|\b(?:require|installed_version)\(\s*[\"'](?:{FRAMEWORKS})\b"
ANYWHERE = re.compile(USES_A_FRAMEWORK)
AT_MODULE_LEVEL = re.compile(rf"^(?:{USES_A_FRAMEWORK}|\S.*\b(?:require|installed_version)\(\s*[\"'](?:{FRAMEWORKS})\b)", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def _module_needs_a_framework(path: pathlib.Path) -> bool:
    return bool(AT_MODULE_LEVEL.search(path.read_text()))


def _needs_a_framework(item) -> bool:
    try:
        return (_module_needs_a_framework(item.path)
                or bool(ANYWHERE.search(inspect.getsource(getattr(item, "function", None) or item.obj))))
    except (OSError, TypeError):
        return True  # cannot tell: not fast


# Seconds each test file took in a whole run (`make test-durations` writes it): `make test` hands whole
# files to its processes in the order of collection, so the costliest go first, and the last ones,
# which one process may run while the other has nothing left, are short. A file not listed counts
# by its tests: one that starts a framework or servers costs seconds, the others far less.
DURATIONS = pathlib.Path(__file__).with_name("durations.json")
DURATIONS_OUT = "MGPU_TEST_DURATIONS"  # where to write this run's durations


def _guess(item) -> float:
    if _needs_a_framework(item):
        return 3.0
    if any(item.get_closest_marker(m) for m in NOT_FAST_MARKS):
        return 2.0
    return 0.05


def pytest_collection_finish(session):
    needs.COLLECTED = True


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    cost: dict[str, float] = collections.defaultdict(float)
    for item in items:
        relative = item.path.relative_to(root).as_posix()
        if (relative.startswith(FAST) and not any(item.get_closest_marker(m) for m in NOT_FAST_MARKS)
                and not _needs_a_framework(item)):
            item.add_marker(pytest.mark.fast)
        cost[relative] += 0.0 if relative in known else _guess(item)
    for relative, seconds in known.items():
        if relative in cost:
            cost[relative] = float(seconds)
    items.sort(key=lambda item: -cost[item.path.relative_to(root).as_posix()])


_file_durations: dict[str, float] = collections.defaultdict(float)


def pytest_runtest_logreport(report):
    if os.environ.get(DURATIONS_OUT):
        _file_durations[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_sessionfinish(session):
    out = os.environ.get(DURATIONS_OUT)
    if out and _file_durations and not hasattr(session.config, "workerinput"):  # the xdist controller, or no xdist
        pathlib.Path(out).write_text(json.dumps({k: round(v, 1) for k, v in sorted(_file_durations.items())},
                                                indent=1) + "\n")
