"""Host input is validated at parse time: bad input is one line on stderr and exit 2."""

import pytest

BAD_INPUTS = [
    # (arguments, words the message must contain)
    (["--workers", ""], "empty"),
    (["--workers", "h1:2222,,h2:2222"], "empty entry"),
    (["--workers", "h1:2222,"], "empty entry"),
    (["--workers", "h1:abc"], "'abc' is not a number"),
    (["--workers", "h1:0"], "port 0 is out of range"),
    (["--workers", "h1:65536"], "port 65536 is out of range"),
    (["--workers", "h1:99999"], "port 99999 is out of range"),
    (["--workers", "h1:-1"], "not a number"),
    (["--workers", "h1:"], "'' is not a number"),
    (["--workers", ":2222"], "empty host name"),
    (["--workers", "h_1!:2222"], "not a valid host name"),
    (["--workers", "bad host:2222"], "not a valid host name"),
    (["--workers", "::1:2222"], "write IPv6 addresses in brackets"),
    (["--workers", "[::1"], "missing ']'"),
    (["--workers", "[::1]2222"], "expected ':PORT'"),
    (["--workers", "[h1]:2222"], "brackets are only for IPv6"),
    (["--workers", "[::zz]:2222"], "not a valid IPv6 address"),
    (["--workers", "300.1.1.1:2222"], "not a valid IPv4 address"),
    (["--workers", "@h1:2222"], "not a valid user name"),
    (["--workers", "a b@h1:2222"], "not a valid user name"),
    (["--workers", "h1:2222,h1:2222"], "h1:2222 is listed twice"),
    (["--workers", "h1:4"], "port 4 is below 1024; if 4 is a number of slots (Horovod's -H host:slots), "
                            "write --hosts h1:4, or 'h1 slots=4' in a --hostfile"),
    (["--workers", "node[3-1]:2222"], "range 3-1 goes backwards"),
    (["--workers", "node[1-2"], "not a valid host name"),
    (["--workers", "node[1-2]]"], "unbalanced brackets"),
    (["--workers", "node[a-b]"], "not a valid host name"),
    (["--workers", "n[0-99999999]"], "more than 65536 hosts"),
    (["--workers", "localhost:2222,127.0.0.1:2222"],
     "localhost:2222 (worker:0) and 127.0.0.1:2222 (worker:1) are one socket on this machine"),
    (["--workers", "127.0.0.1:2222", "--chief", "localhost:2222"], "are one socket on this machine"),
    (["--hosts", "h1:x"], "'h1:x': slots must be a positive number"),
    (["--hosts", "h1:0"], "slots must be a positive number, not '0'"),
    (["--hosts", "h1:2", "--workers", "h2"], "give only one of --workers and --hosts"),
    (["--workers", "h1:2222", "--chief", "h1:2222"], "h1:2222 is listed twice"),
    (["--workers", "h1", "--port", "0"], "port 0 is out of range"),
    (["--workers", "h1", "--port", "x"], "'x' is not a number"),
    (["--workers", "h1:2222", "--evaluator", "h3:2222"], "evaluator is not part of the cluster"),
    (["--workers", "h1:2222", "--chief"], "--chief needs a host"),
    (["--workers", "127.0.0.1:2222,h2:2222"], "loopback address 127.0.0.1 is mixed with remote host h2"),
    (["--workers", "localhost:2222", "--chief", "h0:2222"], "loopback address localhost is mixed"),
    (["--workers", "h1:2222", "--local", "2"], "give only one of --workers and --local"),
    ([], "no hosts"),
    (["--local", "0"], "0 is not in the range"),
    (["--local", "two"], "'two' is not a valid integer"),
    (["--local", "2", "--chief", "h0:2222"], "with --local, --chief takes no value"),
    (["--local", "2", "--evaluator", "h3"], "with --local, --evaluator takes no value"),
    (["--workers", "h1:2222", "--env", "NOEQUALS"], "'NOEQUALS' is not NAME=VALUE"),
    (["--workers", "h1:2222", "--env", "1BAD=x"], "'1BAD' is not a valid environment variable name"),
    (["--workers", "h1:2222", "--forward-env", "MGPU_SURELY_UNSET_VAR"], "MGPU_SURELY_UNSET_VAR is not set"),
    (["--workers", "h1:2222", "--show", "server"], "task type must be one of"),
    (["--workers", "h1:2222", "--show", "worker:x"], "task index must be a number"),
    (["--workers", "h1:2222", "--grace-period", "-1"], "-1"),
    (["--workers", "h1:2222", "--ssh-port", "70000"], "port 70000 is out of range"),
    (["--workers", "h1:2222", "--threads-per-task", "0"], "0 is not in the range"),
    (["--hostfile", "/nonexistent/hosts"], "No such file or directory"),
    (["--workers", "h1:2222", "--env", "TF_CONFIG={}"], "TF_CONFIG is set by mgpu for each task"),
    (["--workers", "h1:2222", "--env", "MGPU_RUN_ID=x"], "MGPU_RUN_ID is set by mgpu for each task"),
    (["--workers", "h1:2222", "--env", "KERAS_DISTRIBUTION_PROCESS_ID=1"],
     "KERAS_DISTRIBUTION_PROCESS_ID is set by mgpu for each task"),
    (["--workers", "h1:2222", "--run-id", "a/b"], "'a/b' is not a valid run id"),
    (["--workers", "h1:2222", "--run-id", "../up"], "'../up' is not a valid run id"),
    (["--workers", "h1:2222", "--ssh-config", "/nonexistent/ssh_config"], "does not exist"),
    (["--workers", "h1:2222", "--identity", "/nonexistent/id_ed25519"], "does not exist"),
    (["--workers", "h1:2222", "--env-file", "/nonexistent/env"], "does not exist"),
    (["--spec", "/nonexistent/spec.yaml"], "No such file or directory"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) or "(none)" for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(mgpu, args, message):
    result = mgpu("launch", *args, "--dry-run")
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


GOOD_INPUTS = [
    ("h1:2222,h2:2222", ["h1:2222", "h2:2222"]),
    ("h1,h2", ["h1:3333", "h2:3333"]),
    ("alice@h1:2222,bob@h2", ["h1:2222", "h2:3333"]),
    ("[fd00::1]:2222,[fd00::2]", ["[fd00::1]:2222", "[fd00::2]:3333"]),
    ("10.0.0.1:1024,10.0.0.1:1025", ["10.0.0.1:1024", "10.0.0.1:1025"]),
    ("node-1.cluster.example.com:65535", ["node-1.cluster.example.com:65535"]),
    (" h1:2222 , h2:2222 ", ["h1:2222", "h2:2222"]),
]


@pytest.mark.parametrize("workers, cluster", GOOD_INPUTS)
def test_good_host_lists(mgpu, workers, cluster):
    result = mgpu("launch", "--workers", workers, "--port", "3333", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    tasks = result.json()["tasks"]
    assert [task["tf_config"]["cluster"]["worker"] for task in tasks] == [cluster] * len(cluster)
    assert [task["tf_config"]["task"] for task in tasks] == [{"type": "worker", "index": i} for i in range(len(cluster))]


def test_user_is_the_ssh_login_not_part_of_the_address(mgpu):
    result = mgpu("launch", "--workers", "alice@h1:2222,h2:2222", "--ssh-user", "bob", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "worker:0  h1:2222  (ssh alice@h1)" in result.stdout
    assert "worker:1  h2:2222  (ssh bob@h2)" in result.stdout


def test_chief_and_evaluator(mgpu):
    result = mgpu("launch", "--chief", "h0:2222", "--workers", "h1:2222", "--evaluator", "h9", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    tasks = result.json()["tasks"]
    assert [(t["type"], t["index"], t["host"], t["port"]) for t in tasks] == [
        ("chief", 0, "h0", 2222), ("worker", 0, "h1", 2222), ("evaluator", 0, "h9", None)]
    for task in tasks:
        assert task["tf_config"]["cluster"] == {"chief": ["h0:2222"], "worker": ["h1:2222"]}
    assert tasks[2]["tf_config"]["task"] == {"type": "evaluator", "index": 0}


def test_options_from_environment(mgpu):
    result = mgpu("launch", "--dry-run", "--json", env={"MGPU_LAUNCH_WORKERS": "h1:2222,h2:2222"})
    assert result.exit_code == 0, result.stderr
    assert len(result.json()["tasks"]) == 2


def test_bad_option_from_environment_names_it(mgpu):
    result = mgpu("launch", "--dry-run", env={"MGPU_LAUNCH_WORKERS": "h1:0"})
    assert result.exit_code == 2
    assert "port 0 is out of range" in result.stderr


def test_unknown_option_is_usage_error(mgpu):
    result = mgpu("launch", "--wokers", "h1:2222")
    assert result.exit_code == 2
    assert "No such option '--wokers'" in result.stderr


def test_json_needs_dry_run(mgpu):
    result = mgpu("launch", "--workers", "h1:2222", "--json")
    assert result.exit_code == 2
    assert "--json goes with --dry-run" in result.stderr


def test_env_file(mgpu, tmp_path):
    path = tmp_path / "env"
    path.write_text("# settings\nA=1\nexport B='two words'\n\nC=x=y\n")
    result = mgpu("launch", "--workers", "h1:2222", "--env-file", str(path), "--env", "A=override",
                  "--dry-run", "--json", "--show-secrets")
    assert result.exit_code == 0, result.stderr
    env = result.json()["tasks"][0]["env"]
    assert (env["A"], env["B"], env["C"]) == ("override", "two words", "x=y")


def test_given_env_values_are_hidden_unless_asked_for(mgpu, tmp_path):
    path = tmp_path / "env"
    path.write_text("FROM_FILE=file-secret\n")
    args = ("launch", "--workers", "h1:2222", "--env-file", str(path), "--env", "FROM_FLAG=flag-secret",
            "--forward-env", "FORWARDED", "--threads-per-task", "2", "--dry-run")
    for extra in ((), ("--json",)):
        result = mgpu(*args, *extra, env={"FORWARDED": "forwarded-secret"})
        assert result.exit_code == 0, result.stderr
        assert "secret" not in result.stdout
        assert result.stdout.count("***") == 3
        assert "TF_CONFIG" in result.stdout and "MGPU_RUN_ID" in result.stdout and "OMP_NUM_THREADS=2" in (
            result.stdout.replace('": "', "="))
    shown = mgpu(*args, "--show-secrets", env={"FORWARDED": "forwarded-secret"})
    assert {"FROM_FILE=file-secret", "FROM_FLAG=flag-secret", "FORWARDED=forwarded-secret"} <= set(shown.stdout.split())


def test_bad_env_file_names_the_line(mgpu, tmp_path):
    path = tmp_path / "env"
    path.write_text("A=1\nNOT AN ASSIGNMENT\n")
    result = mgpu("launch", "--workers", "h1:2222", "--env-file", str(path), "--dry-run")
    assert result.exit_code == 2
    assert f"{path}:2: the line is not NAME=VALUE (it has no '=')" in result.stderr


def test_forwarded_variables(mgpu):
    result = mgpu("launch", "--workers", "h1:2222", "--forward-env", "MY_TOKEN", "--dry-run", "--json",
                  "--show-secrets", env={"MY_TOKEN": "s3cret", "OTHER": "x"})
    env = result.json()["tasks"][0]["env"]
    assert env["MY_TOKEN"] == "s3cret" and "OTHER" not in env


def test_forwarded_prefixes(mgpu):
    """`NCCL_*` forwards every NCCL_ variable set here, and nothing when none is."""
    result = mgpu("launch", "--workers", "h1:2222", "--forward-env", "NCCL_*", "--forward-env", "MY_TOKEN",
                  "--dry-run", "--json", "--show-secrets",
                  env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "NCCLX": "no", "MY_TOKEN": "t"})
    assert result.exit_code == 0, result.stderr
    env = result.json()["tasks"][0]["env"]
    assert (env["NCCL_DEBUG"], env["NCCL_SOCKET_IFNAME"], env["MY_TOKEN"]) == ("INFO", "eth0", "t")
    assert "NCCLX" not in env
    text = mgpu("launch", "--workers", "h1:2222", "--forward-env", "NCCL_*", "--dry-run",
                env={"NCCL_DEBUG": "INFO"}).stdout
    assert "NCCL_DEBUG=***" in text  # forwarded values are hidden like the others
    result = mgpu("launch", "--workers", "h1:2222", "--forward-env", "MGPU_NOTHING_SET_HERE_*", "--dry-run")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("pattern", ["*", "NCCL*_", "1NCCL_*", "NC-CL*"])
def test_bad_forwarded_prefixes_are_refused(mgpu, pattern):
    result = mgpu("launch", "--workers", "h1:2222", "--forward-env", pattern, "--dry-run")
    assert result.exit_code == 2 and "is not a valid environment variable name" in result.stderr


def test_a_prefix_that_takes_in_a_reserved_name_is_refused(mgpu):
    result = mgpu("launch", "--workers", "h1:2222", "--forward-env", "MASTER_*", "--dry-run",
                  env={"MASTER_ADDR": "elsewhere"})
    assert result.exit_code == 2
    assert "environment variable MASTER_ADDR is set by mgpu for each task and cannot be given" in result.stderr
