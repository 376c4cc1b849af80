"""One reading of numbers, env files, host names and workdirs wherever they come in."""

import pytest

from launcher import protocol

ARABIC_THREE = "\u0663"  # int() and float() read it as 3; mgpu takes ASCII digits only
NO_SLURM = {name: "" for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                                   "SLURM_TASKS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_PROCID",
                                   "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURMD_NODENAME")}


def assert_refused(result, expected):
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("mgpu: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr, result.stderr


@pytest.mark.parametrize("args, expected", [
    (["--hosts", f"h1:{ARABIC_THREE}"], f"slots must be a positive number, not '{ARABIC_THREE}'"),
    (["--local", ARABIC_THREE], f"'{ARABIC_THREE}' is not a number (ASCII digits)"),
    (["--local", "1", "--threads-per-task", ARABIC_THREE], "is not a number (ASCII digits)"),
    (["--local", "1", "--grace-period", ARABIC_THREE], "is not a number of seconds"),
    (["--workers", f"h1:{ARABIC_THREE}"], "is not a number"),
])
def test_numbers_are_ascii_digits_on_the_command_line(mgpu, args, expected):
    assert_refused(mgpu("launch", *args, "--dry-run"), expected)


def test_numbers_are_ascii_digits_in_hostfiles(mgpu, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"h1 slots={ARABIC_THREE}\n")
    assert_refused(mgpu("launch", "--hostfile", str(hostfile), "--dry-run"),
                   f"{hostfile}:1: slots must be a positive number, not '{ARABIC_THREE}'")


@pytest.mark.parametrize("variables, expected", [
    ({"SLURM_PROCID": "\u00b2"}, "SLURM_PROCID '\u00b2' is not a task rank (ASCII digits)"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_TASKS_PER_NODE": ARABIC_THREE}, "is not N or N(xR)"),
])
def test_numbers_are_ascii_digits_in_slurm_variables(mgpu, variables, expected):
    env = {**NO_SLURM, "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1", **variables}
    assert_refused(mgpu("tf-config", "--from-slurm", env=env), expected)


def test_a_progress_line_with_other_digits_is_not_progress():
    assert protocol.parse_progress(f"{protocol.PROGRESS_PREFIX}\u00b2/3") is None
    assert protocol.parse_progress(f"{protocol.PROGRESS_PREFIX}{ARABIC_THREE}/3") is None
    assert protocol.parse_progress(f"{protocol.PROGRESS_PREFIX}2/3") == (2, 3)


def test_env_files_follow_dotenv_syntax(mgpu, tmp_path):
    env_file = tmp_path / "env"
    env_file.write_text("A=1 # a comment\n"
                        "export B='single # quoted'\n"
                        'C="two\nlines"\n'
                        "  D = spaced  \n"
                        "E=${HOME}\n"
                        "# a comment line\n\n")
    result = mgpu("launch", "--local", "1", "--env-file", str(env_file), "--dry-run", "--json", "--show-secrets")
    assert result.exit_code == 0, result.stderr
    env = result.json()["tasks"][0]["env"]
    assert {k: env[k] for k in "ABCDE"} == {"A": "1", "B": "single # quoted", "C": "two\nlines", "D": "spaced",
                                            "E": "${HOME}"}


@pytest.mark.parametrize("text, expected", [
    ('A=1\nB="unterminated\n', ":2: the value of B cannot be parsed (an unclosed quote?)"),
    ("A=1\nB\n", ":2: the line is not NAME=VALUE (it has no '=')"),
    ("1A=2\n", ":1: '1A' is not a valid environment variable name"),
])
def test_env_file_lines_dotenv_cannot_read_are_refused(mgpu, tmp_path, text, expected):
    env_file = tmp_path / "env"
    env_file.write_text(text)
    assert_refused(mgpu("launch", "--local", "1", "--env-file", str(env_file), "--dry-run"), f"{env_file}{expected}")


SECRET = "sk-live-4f9c2e"


@pytest.mark.parametrize("text, expected", [
    (f'A=1\nAPI_TOKEN="{SECRET}\nB=2\n', ":2: the value of API_TOKEN cannot be parsed (an unclosed quote?)"),
    (f" export  API_TOKEN = '{SECRET}\n", ":1: the value of API_TOKEN cannot be parsed (an unclosed quote?)"),
    (f"A=1\n{SECRET}\n", ":2: the line is not NAME=VALUE (it has no '=')"),
    (f"API_TOKEN {SECRET}\n", ":1: the line is not NAME=VALUE (it has no '=')"),
])
def test_env_file_errors_name_the_line_and_variable_never_the_value(mgpu, tmp_path, text, expected):
    env_file = tmp_path / "env"
    env_file.write_text(text)
    result = mgpu("launch", "--local", "1", "--env-file", str(env_file), "--dry-run")
    assert_refused(result, f"{env_file}{expected}")
    assert SECRET not in result.stderr


def test_a_forwarded_value_that_is_not_utf8_is_not_shown(mgpu):
    result = mgpu("launch", "--local", "1", "--forward-env", "API_TOKEN", "--dry-run",
                  env={"API_TOKEN": SECRET + "\udcff"})  # the byte 0xff, as Python's os.environ holds it
    assert_refused(result, "--forward-env API_TOKEN: its value is not valid UTF-8")
    assert SECRET not in result.stderr


def test_spec_env_numbers_that_lose_their_text_are_refused(mgpu, tmp_path):
    spec = tmp_path / "spec.yaml"
    for value in (".nan", "1.0e+3", "0.10"):
        spec.write_text(f"cluster: {{worker: [h1:2222]}}\nenv: {{A: {value}}}\n")
        assert_refused(mgpu("launch", "--spec", str(spec), "--dry-run"), "env.A is a YAML number")
    spec.write_text("cluster: {worker: [h1:2222]}\nenv: {A: 10, B: '.nan'}\n")
    result = mgpu("launch", "--spec", str(spec), "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "A=10" in result.stdout and "B=.nan" in result.stdout


@pytest.mark.parametrize("hostname", ["a,b", "-oProxyCommand=x", "h1 h2"])
def test_ssh_config_host_names_are_checked_before_they_reach_tf_config(mgpu, tmp_path, hostname):
    config = tmp_path / "ssh_config"
    config.write_text(f"Host h1\n  HostName {hostname}\n")
    for command in (("tf-config", "--task-index", "0"), ("launch", "--dry-run")):
        assert_refused(mgpu(*command, "--workers", "h1:2222", "--ssh-config", str(config)),
                       "h1: ssh config: HostName")


@pytest.mark.parametrize("nodelist", ["-oProxyCommand=x", "n1,-oProxyCommand=x"])
def test_slurm_node_names_are_checked_before_they_reach_tf_config(mgpu, nodelist):
    env = {**NO_SLURM, "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": nodelist}
    assert_refused(mgpu("launch", "--slurm", "--dry-run", env=env), "'-oProxyCommand=x' is not a valid host name")


def test_a_missing_local_workdir_is_named(mgpu, tmp_path):
    missing = tmp_path / "missing"
    result = mgpu("launch", "--local", "1", "--workdir", str(missing), "--log-dir", str(tmp_path / "logs"),
                  "--", "true")
    assert_refused(result, f"workdir {missing} does not exist on this machine")
    assert not list((tmp_path / "logs").glob("*/run.json"))  # nothing started
