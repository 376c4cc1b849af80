"""Hostile or broken input: one line, exit 2, at once, nothing started."""

import json
import subprocess

import pytest

import launching

BILLION_LAUGHS = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip([None, *"abcdefgh"], "abcdefghi")
) + "cluster: {worker: [h1:2222]}\nport: *i\n"

BAD_FILES = [
    ("spec", BILLION_LAUGHS.encode(), "too large once its aliases are expanded"),
    ("spec", ("cluster: {worker: [h1:2222]}\nenv: " + "[" * 50_000 + "]" * 50_000 + "\n").encode(),
     "nested too deeply"),
    ("spec", ("cluster: {worker: [h1:2222]}\nenv:\n" + "".join(" " * i + "a:\n" for i in range(1, 200))).encode(),
     "nested too deeply"),
    ("spec", b"a: &a [*a]\ncluster: {worker: [h1:2222]}\n", "an alias refers to a value that contains it"),
    ("spec", b"cluster: {worker: [h1:2222]}\nport: 1\nport: 2\n", "key 'port' appears twice in one mapping, at line 3"),
    ("spec", b'{"cluster": {"worker": ["h1:2222"], "worker": ["h2:2222"]}}', "key 'worker' appears twice"),
    ("spec", b"cluster: {worker: [h1:2222]}\ngpus_per_task: 1000000000\n", "gpus_per_task must be a whole number"),
    ("spec", b'cluster: {worker: [h1:2222]}\nenv: {A: "x\\0y"}\n', "contains a NUL character"),
    ("spec", b"cluster: {worker: [h\xff1:2222]}\n", "not a text file (not UTF-8)"),
    ("spec", b"cluster: {worker: [h1:2222]}\0\n", "not a text file (it contains NUL bytes)"),
    ("hostfile", "h1 slots=²\n".encode(), "slots must be a positive number, not '²'"),
    ("hostfile", "h1:²\n".encode(), "is not a number"),
    ("env-file", b"A=\xff\n", "not a text file (not UTF-8)"),
]


def run_mgpu(*args: str) -> subprocess.CompletedProcess:
    """mgpu's output as bytes: some cases make it name bytes that are not UTF-8."""
    return launching.run_mgpu(*args, timeout=30, text=False)


def assert_usage_error(result: subprocess.CompletedProcess, expected: str) -> None:
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert stderr.startswith("mgpu: error: ") and stderr.count("\n") == 1, stderr
    assert expected in stderr


@pytest.mark.parametrize("kind,content,expected", BAD_FILES, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD_FILES)])
def test_bad_files(tmp_path, kind, content, expected):
    path = tmp_path / "input"
    path.write_bytes(content)
    hosts = ["--workers", "h1:2222"] if kind == "env-file" else []
    assert_usage_error(run_mgpu("launch", *hosts, f"--{kind}", str(path), "--dry-run"), expected)


BAD_ARGS = [
    (["--grace-period", "nan"], "'nan' is not a finite number of seconds"),
    (["--start-timeout", "inf"], "'inf' is not a finite number of seconds"),
    (["--connect-timeout", "nan"], "'nan' is not a finite number of seconds"),
    (["--connect-timeout", "-inf"], "'-inf' is not a finite number of seconds"),
    (["--grace-period", "1e300"], "is not between 0 and"),
    (["--gpus-per-task", "1000000000"], "1000000000 is not in the range 0<=x<=1024"),
    (["--threads-per-task", "1000000000"], "is not in the range 1<=x<=4096"),
    (["--env", "A=sk-live-4f9c2e\udcff"], "--env A: its value is not valid UTF-8"),
    (["--workdir", "/x\udcff"], "--workdir: b'/x\\xff' is not valid UTF-8"),
    (["--", "prog\udcff"], "the command: b'prog\\xff' is not valid UTF-8"),
    (["--run-id", "a\n"], "is not a valid run id"),
    (["--env", "A\n=1"], "is not a valid environment variable name"),
]


@pytest.mark.parametrize("args,expected", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_arguments(args, expected):
    assert_usage_error(run_mgpu("launch", "--workers", "h1:2222", *[a.encode("utf-8", "surrogateescape").decode(
        "utf-8", "surrogateescape") for a in args], "--dry-run"), expected)


def test_an_endless_env_file_is_refused():
    """/dev/zero is not a regular file: refused before a byte is read."""
    assert_usage_error(run_mgpu("launch", "--workers", "h1:2222", "--env-file", "/dev/zero", "--dry-run"),
                       "--env-file /dev/zero: is a character device, not a regular file")


@pytest.mark.parametrize("port,expected", [("abc", "Port abc: port 'abc' is not a number"),
                                           ("99999", "Port 99999: port 99999 is out of range")])
def test_bad_ssh_config_ports(tmp_path, port, expected):
    config = tmp_path / "ssh_config"
    config.write_text(f"Host h1\n  Port {port}\n")
    result = run_mgpu("launch", "--workers", "h1:2222", "--ssh-config", str(config), "--log-dir", str(tmp_path / "runs"),
                      "--", "true")
    assert_usage_error(result, f"h1: ssh config: {expected}")


def test_a_remote_command_line_too_long_is_refused_before_connecting(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host h1\n  HostName 127.0.0.1\n  Port 9\n")  # nothing listens: connecting would fail
    result = run_mgpu("launch", "--workers", "h1:2222", "--ssh-config", str(config), "--log-dir", str(tmp_path / "runs"),
                      "--", "echo", *["x" * 1000] * 200)
    assert_usage_error(result, "worker:0: the command line is")


def test_a_command_line_over_the_limit_only_with_what_a_start_adds_is_refused_too(tmp_path):
    """The check measures the command a start sends, with the join reporter beside the task and the
    variables every attempt adds, not the plan's alone: one argument sized to leave the plan's own
    command just under the limit is still refused before connecting."""
    from launcher.backends.ssh.remote_command import MAX_COMMAND_BYTES, task_command

    config = tmp_path / "ssh_config"
    config.write_text("Host h1\n  HostName 127.0.0.1\n  Port 9\n")  # nothing listens: connecting would fail
    dry = run_mgpu("launch", "--workers", "h1:2222", "--ssh-config", str(config), "--dry-run", "--json", "--",
                   "echo", "x")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["tasks"][0]
    own = len(task_command(plan["argv"], plan["env"], plan.get("workdir"), 10.0).command.encode())
    filler = "x" * (MAX_COMMAND_BYTES - own - 64)  # the plan's own command: 63 bytes under the limit
    result = run_mgpu("launch", "--workers", "h1:2222", "--ssh-config", str(config), "--log-dir", str(tmp_path / "runs"),
                      "--", "echo", filler)
    assert_usage_error(result, "worker:0: the command line is")
