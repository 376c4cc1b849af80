"""Spec files and hostfiles: golden plans for the shipped examples, and one clear line for each mistake."""

import json
import os
import pathlib
import sys

import pytest

from launching import REPO

GOLDEN = pathlib.Path(__file__).parent / "golden"
EXAMPLES = sorted((REPO / "cluster_specs").glob("*.yaml")) + sorted((REPO / "cluster_specs").glob("*.json"))


def normalized(plan_json: dict) -> dict:
    """The plan with this interpreter's path replaced, so the golden files hold on any machine."""
    text = json.dumps(plan_json).replace(json.dumps(sys.executable)[1:-1], "PYTHON")
    return json.loads(text)


def test_examples_exist():
    assert {path.name for path in EXAMPLES} >= {
        "two_workers.yaml", "chief_workers_evaluator.yaml", "local_simulation.yaml", "per_host_ssh.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_golden_plan(mgpu, example):
    result = mgpu("launch", "--spec", str(example), "--run-id", "golden", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    plan = normalized(result.json())
    golden = GOLDEN / (example.stem + ".json")
    if os.environ.get("MGPU_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(json.dumps(plan, indent=2) + "\n")
    assert plan == json.loads(golden.read_text())


def test_golden_hostfile(mgpu):
    result = mgpu("launch", "--hostfile", str(REPO / "cluster_specs" / "hostfile.txt"), "--run-id", "golden",
                  "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    tasks = result.json()["tasks"]
    assert tasks[0]["tf_config"]["cluster"] == {
        "worker": ["node-1:2222", "node-1:2223", "node-2:3000", "node-3:2222", "node-3:2223"]}
    assert [task["index"] for task in tasks] == [0, 1, 2, 3, 4]


def test_per_host_ssh_settings_in_text_dry_run(mgpu):
    result = mgpu("launch", "--spec", str(REPO / "cluster_specs" / "per_host_ssh.yaml"), "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "worker:0  gpu-a.internal:2222  (ssh mlops@gpu-a.internal)" in result.stdout
    assert "worker:1  gpu-b.internal:2222  (ssh alice@gpu-b.internal)" in result.stdout
    assert "worker:2  gpu-c.internal:2300  (ssh mlops@gpu-c.internal:2022 via bastion.example.com)" in result.stdout
    assert "command:   /opt/venvs/tf/bin/python -m launcher.trainer" in result.stdout


def test_command_line_overrides_spec(mgpu):
    spec = str(REPO / "cluster_specs" / "chief_workers_evaluator.yaml")
    result = mgpu("launch", "--spec", spec, "--env", "TF_CPP_MIN_LOG_LEVEL=3", "--dry-run", "--json",
                  "--show-secrets", "--", "python3", "other.py")
    assert result.exit_code == 0, result.stderr
    task = result.json()["tasks"][0]
    assert task["argv"] == ["python3", "other.py"]
    assert task["env"]["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert task["env"]["OMP_NUM_THREADS"] == "8"


BAD_SPECS = [
    ("cluster: {worker: [h1:2222], ps: [h9:2222]}", "parameter servers need a chief"),
    ("cluster: {worker: [h1:2222]}\nps: [h9:2222]", "the ps list goes under 'cluster:'"),
    ("cluster: {worker: [h1:2222], evaluator: [h9]}", "evaluator must not be inside 'cluster'"),
    ("cluster: {chief: [h0:1, h00:1], worker: [h1:2222]}", "at most one chief"),
    ("cluster: {worker: [h1:2222]}\nevaluator: [e1, e2]", "at most one evaluator"),
    ("cluster: {worker: [h1:2222]}\nworkdri: /tmp", "unknown key 'workdri' in the spec"),
    ("cluster: {worker: [h1:2222]}\nssh: {usr: bob}", "unknown key 'usr' in ssh"),
    ("cluster: {worker: [h1:2222]}\nhosts: {h1: {prot: 22}}", "unknown key 'prot' in hosts.h1"),
    ("cluster: {workers: [h1:2222]}", "unknown key 'workers' in cluster"),
    ("cluster: {worker: []}", "the cluster is empty"),
    ("cluster: {}", "the cluster is empty"),
    ("worker: [h1:2222]", "go under 'cluster:'"),
    ("port: 2222", "missing 'cluster'"),
    ("", "the file is empty"),
    ("cluster: [h1]", "cluster must be a mapping"),
    ("cluster: {worker: [h1:2222, h1:2222]}", "h1:2222 is listed twice"),
    ("cluster: {worker: [h1:70000]}", "port 70000 is out of range"),
    ("cluster: {worker: [h1]}", "has no port"),
    ("cluster: {worker: [h1]}\nport: 0", "port: port 0 is out of range"),
    ("cluster: {worker: [h1:2222]}\nthreads_per_task: 0", "threads_per_task must be a whole number >= 1"),
    ("cluster: {worker: [h1:2222]}\ncommand: []", "command is empty"),
    ("cluster: {worker: [h1:2222]}\nenv: {1X: y}", "not a valid environment variable name"),
    ("cluster: {worker: [127.0.0.1:2222, h2:2222]}", "is mixed with remote host h2"),
    ("cluster: {worker: [h1:2222]\n", "line 2"),
    ("cluster: {worker: [h1:2222]}\nlegacy_keras: yes please", "legacy_keras must be true or false"),
    ("cluster: {worker: [h1:2222]}\nstall_timeout: -1", "stall_timeout must be a number of seconds >= 0"),
    ("cluster: {worker: [h1:2222]}\nstall_timeout: .nan", "stall_timeout must be a number of seconds >= 0"),
    ("cluster: {worker: [h1:2222]}\nstall_timeout: '600'", "stall_timeout must be a number of seconds >= 0"),
    ("cluster: {worker: [h1:2222]}\ntensorboard: [tb]", "tensorboard must be a string"),
]


def assert_usage_error(result, message):
    """Bad input: exit 2, one line on stderr that says what is wrong, nothing on stdout."""
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


@pytest.mark.parametrize("text, message", BAD_SPECS)
def test_bad_spec_names_file_and_problem(mgpu, tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = mgpu("launch", "--spec", str(path), "--dry-run")
    assert_usage_error(result, message)
    if "mixed" not in message:
        assert str(path) in result.stderr


def test_json_spec(mgpu, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"cluster": {"worker": ["h1:2222", "h2:2222"]}, "env": {"A": "1"}}))
    result = mgpu("launch", "--spec", str(path), "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert [task["env"]["A"] for task in result.json()["tasks"]] == ["1", "1"]


def test_legacy_keras_from_the_command_line_or_the_spec_file(mgpu, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster: {worker: [h1:2222, h2:2222]}\n")
    plain = mgpu("launch", "--spec", str(path), "--dry-run", "--json")
    assert [task["env"].get("TF_USE_LEGACY_KERAS") for task in plain.json()["tasks"]] == [None, None]
    flag = mgpu("launch", "--spec", str(path), "--legacy-keras", "--dry-run", "--json")
    assert [task["env"]["TF_USE_LEGACY_KERAS"] for task in flag.json()["tasks"]] == ["1", "1"]
    path.write_text("cluster: {worker: [h1:2222, h2:2222]}\nlegacy_keras: true\n")
    from_file = mgpu("launch", "--spec", str(path), "--dry-run", "--json")
    assert [task["env"]["TF_USE_LEGACY_KERAS"] for task in from_file.json()["tasks"]] == ["1", "1"]
    assert "TF_USE_LEGACY_KERAS=1" in mgpu("launch", "--local", "1", "--legacy-keras", "--dry-run").stdout


BAD_HOSTFILES = [
    ("h1 slots=x", "hosts:1: slots must be a positive number"),
    ("h1 slots=0", "hosts:1: slots must be a positive number"),
    ("h1\nh2 cpus=3", "hosts:2: unknown setting 'cpus=3'"),
    ("# only a comment\n", "no hosts in the hostfile"),
    ("h1:99999", "hosts:1: 'h1:99999': port 99999 is out of range"),
    ("h1 slots=2\nh1:2223", "h1:2223 is listed twice"),
    ("h1:65535 slots=2", "runs past port 65535"),
]


@pytest.mark.parametrize("text, message", BAD_HOSTFILES)
def test_bad_hostfile(mgpu, tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    assert_usage_error(mgpu("launch", "--hostfile", str(path), "--dry-run"), message)


def test_hostfile_comments_and_user(mgpu, tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\n\nalice@h1:3000  # first\nh2 slots=2 max_slots=4\n")
    result = mgpu("launch", "--hostfile", str(path), "--port", "4000", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["tasks"][0]["tf_config"]["cluster"]["worker"] == ["h1:3000", "h2:4000", "h2:4001"]


def test_trainer_style_arguments_extend_the_spec_command(mgpu, tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("cluster: {worker: [h1:2222]}\ncommand: [python3, train.py]\n")
    result = mgpu("launch", "--spec", str(path), "--dry-run", "--json", "--", "--epochs", "3")
    assert result.json()["tasks"][0]["argv"] == ["python3", "train.py", "--epochs", "3"]
    path.write_text("cluster: {worker: [h1:2222]}\ntrainer_args: [--model, small]\n")
    result = mgpu("launch", "--spec", str(path), "--dry-run", "--json", "--", "--train-steps", "9")
    assert result.json()["tasks"][0]["argv"][-4:] == ["--model", "small", "--train-steps", "9"]


def test_parameter_servers_from_a_spec_the_command_line_and_tf_config(mgpu, tmp_path):
    """ps tasks join TF_CONFIG's cluster after the workers; they are TF-only: no job variables."""
    path = tmp_path / "ps.yaml"
    path.write_text("cluster: {chief: [h0:2222], worker: [h1:2222, h2:2222], ps: [h3:2222]}\n")
    from_spec = mgpu("launch", "--spec", str(path), "--dry-run", "--json", "--", "python3", "ps.py")
    from_flags = mgpu("launch", "--chief", "h0:2222", "--workers", "h1,h2", "--ps-hosts", "h3", "--dry-run", "--json",
                      "--", "python3", "ps.py")
    for result in (from_spec, from_flags):
        assert result.exit_code == 0, result.stderr
        tasks = result.json()["tasks"]
        assert [(t["type"], t["index"]) for t in tasks] == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
        assert tasks[3]["tf_config"] == {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"],
                                                     "ps": ["h3:2222"]}, "task": {"type": "ps", "index": 0}}
        assert "RANK" not in tasks[3]["env"] and tasks[0]["env"]["WORLD_SIZE"] == "3"
    tf_config = mgpu("tf-config", "--spec", str(path), "--task-type", "ps", "--task-index", "0")
    assert tf_config.exit_code == 0, tf_config.stderr
    assert json.loads(tf_config.stdout)["task"] == {"type": "ps", "index": 0}
    assert_usage_error(mgpu("launch", "--local", "2", "--ps", "1", "--dry-run"), "parameter servers need a chief")
    assert_usage_error(mgpu("launch", "--workers", "h1:2222", "--ps", "1", "--dry-run"), "--ps N goes with --local")
    assert_usage_error(mgpu("launch", "--local", "1", "--chief", "--ps", "1", "--dry-run"),
                       "the built-in trainer uses MultiWorkerMirroredStrategy, which has no parameter servers")


def test_a_parameter_server_cluster_keeps_two_inter_op_threads(mgpu):
    """Under ParameterServerStrategy one inter-op thread per task hangs the chief on its workers."""
    with_ps = mgpu("launch", "--local", "2", "--chief", "--ps", "1", "--threads-per-task", "1", "--dry-run", "--json",
                   "--", "python3", "ps.py")
    assert with_ps.exit_code == 0, with_ps.stderr
    for task in with_ps.json()["tasks"]:
        assert (task["env"]["TF_NUM_INTRAOP_THREADS"], task["env"]["TF_NUM_INTEROP_THREADS"]) == ("1", "2")
    without = mgpu("launch", "--local", "2", "--threads-per-task", "1", "--dry-run", "--json", "--", "python3", "w.py")
    assert {task["env"]["TF_NUM_INTEROP_THREADS"] for task in without.json()["tasks"]} == {"1"}


def test_tensorboard_folder_from_the_spec_file():
    from launcher.config.spec_file import load_spec_text

    spec = load_spec_text("cluster: {worker: [h1:2222]}\ntensorboard: runs/tb\n", "spec.yaml")
    assert spec.tensorboard == "runs/tb"
