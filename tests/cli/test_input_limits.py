"""Input that would grow without bound, or never end: refused with one line, exit 2, before
anything is expanded or read. Each case runs in a real mgpu process whose address space is
capped, so that expanding first (and failing with MemoryError) cannot pass for a refusal."""

import os
import resource
import subprocess

import pytest

import launching

ADDRESS_SPACE = 1 << 30  # far more than mgpu needs for any accepted input; far less than expanding takes
SLURM = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_mgpu(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in launching.mgpu_env().items() if not k.startswith(("SLURM_", "MGPU_"))}
    return launching.run_mgpu(*args, env={**environ, **(env or {})}, preexec_fn=_cap_memory)


def assert_refused(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("mgpu: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr, result.stderr


TOO_MANY = "more than 100000 tasks, the most mgpu runs"


def test_a_small_hostfile_of_ranges_is_counted_before_it_is_expanded(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"aa{i}[00000-65535]\n" for i in range(100)))  # 1.7 KB, 6.5 million hosts
    assert_refused(run_mgpu("launch", "--hostfile", str(hostfile), "--dry-run"), f"{hostfile}:2: {TOO_MANY}")


def test_slots_are_counted_too(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n[0-9] slots=20000\n")
    assert_refused(run_mgpu("launch", "--hostfile", str(hostfile), "--dry-run"), f"{hostfile}:1: {TOO_MANY}")
    assert_refused(run_mgpu("launch", "--hosts", "n[0-65535]:60000", "--dry-run"), TOO_MANY)
    assert_refused(run_mgpu("launch", "--workers", "a[0-65535],b[0-65535]", "--dry-run"), TOO_MANY)


def test_spec_entries_are_counted_before_they_are_expanded(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("port: 2222\ncluster:\n  worker: [" + ", ".join(f'"w{i}[00000-65535]"' for i in range(50)) + "]\n")
    assert_refused(run_mgpu("launch", "--spec", str(spec), "--dry-run"), f"cluster.worker: {TOO_MANY}")
    spec.write_text("port: 2222\ncluster: {worker: [h1]}\nhosts:\n"
                    + "".join(f'  "h{i}[00000-65535]": {{user: u}}\n' for i in range(50)))
    assert_refused(run_mgpu("launch", "--spec", str(spec), "--dry-run"), "hosts: names more than 100000 hosts")


@pytest.mark.parametrize("layout, expected", [
    ("1(x999999999)", "describes 999999999 nodes (at most 65536)"),
    ("99999999999", TOO_MANY),
])
def test_slurm_task_layout_is_counted_before_it_is_expanded(layout, expected):
    env = {**SLURM, "SLURM_TASKS_PER_NODE": layout}
    assert_refused(run_mgpu("launch", "--slurm", "--dry-run", env=env), expected)


def test_the_limit_leaves_room_for_100000_tasks(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n[0-9999] slots=10\n")
    result = run_mgpu("tf-config", "--hostfile", str(hostfile), "--task-index", "99999")
    assert result.returncode == 0, result.stderr
    assert '"index": 99999' in result.stdout and "n9999:2231" in result.stdout


FILE_OPTIONS = ["--hostfile", "--spec", "--env-file", "--ssh-config", "--known-hosts", "--identity"]


def _with_file(option: str, path: str) -> list[str]:
    hosts = [] if option in ("--hostfile", "--spec") else ["--workers", "h1:2222"]
    return ["launch", *hosts, option, str(path), "--dry-run"]


@pytest.mark.parametrize("option", FILE_OPTIONS)
def test_a_fifo_is_refused_not_waited_on(tmp_path, option):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_refused(run_mgpu(*_with_file(option, fifo)), f"{option} {fifo}: is a FIFO, not a regular file")


@pytest.mark.parametrize("option", FILE_OPTIONS)
def test_a_directory_or_device_is_refused(tmp_path, option):
    assert_refused(run_mgpu(*_with_file(option, tmp_path)), f"{option} {tmp_path}: is a directory")
    assert_refused(run_mgpu(*_with_file(option, "/dev/zero")), f"{option} /dev/zero: is a character device")


def test_a_huge_known_hosts_is_refused_unread(tmp_path):
    known_hosts = tmp_path / "known_hosts"
    with open(known_hosts, "wb") as f:
        f.truncate(3 << 30)  # sparse: 3 GB that take no disk
    assert_refused(run_mgpu(*_with_file("--known-hosts", known_hosts)), "larger than 64 MiB")


def test_an_unparsable_ssh_config_names_the_problem(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host h1\n  ProxyCommand\n")
    result = run_mgpu(*_with_file("--ssh-config", config))
    assert_refused(result, f"--ssh-config {config}: ")
    assert not result.stderr.rstrip().endswith(":"), result.stderr


def test_the_known_hosts_reader_keeps_the_limits_itself(tmp_path, capsys):
    """~/.ssh/known_hosts is read without an option to check it: a FIFO there is skipped, not waited on."""
    from launcher.backends.ssh import known_hosts

    path = tmp_path / "known_hosts"
    path.write_bytes(b"h1 ssh-ed25519 AAAA\n" * 10)
    assert len(known_hosts.load([str(path)])) == 10
    os.mkfifo(tmp_path / "fifo")
    assert known_hosts.load([str(tmp_path / "fifo")]) == []
    assert "is a FIFO, not a regular file; skipped" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["h1", "n[1-4]", "n[01-03,7]", "rack[1-2]n[1-4]", "u@n[8-11]:2222",
                                   "[fd00::1]:2222", "n[1-3]m[5,7]x[0-1]"])
def test_counting_an_entry_agrees_with_expanding_it(entry):
    from launcher.config.hostlist import count_entry, expand_entry

    assert count_entry(entry) == len(expand_entry(entry))


def test_counting_absurd_entries_takes_no_memory():
    from launcher.config.hostlist import count_entry

    assert count_entry("n" + "[0-65535]" * 1000) >= 10**18  # counted, never built


@pytest.mark.parametrize("option", ["--hostfile", "--spec", "--env-file", "--ssh-config"])
def test_an_input_file_over_16_mib_is_refused_unread(tmp_path, option):
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(16 * 1024 * 1024 + 1)  # sparse: one byte over the limit
    assert_refused(run_mgpu(*_with_file(option, big)), f"{option} {big}: larger than 16 MiB")


def test_an_env_file_of_16_mib_is_read(tmp_path):
    env_file = tmp_path / "env"
    line = "A=" + "x" * 1000 + "\n"
    env_file.write_text(line * (16 * 1024 * 1024 // len(line)))  # at the limit: read, not refused
    result = run_mgpu(*_with_file("--env-file", env_file))
    assert result.returncode == 0, result.stderr
