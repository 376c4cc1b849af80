"""tf-config, help texts, and the CLI as a real installed program that never imports TensorFlow."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import launcher
from launching import REPO, run_mgpu
from needs import stand_in


def test_tf_config_json(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1")
    assert result.exit_code == 0, result.stderr
    assert result.json() == {"cluster": {"worker": ["h1:2222", "h2:2222"]}, "task": {"type": "worker", "index": 1}}


def test_tf_config_env_format_is_shell_safe(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--chief", "h0:2222", "--task-type", "chief",
                  "--task-index", "0", "--format", "env")
    assert result.exit_code == 0, result.stderr
    out = subprocess.run(["bash", "-c", result.stdout + 'printf %s "$TF_CONFIG"'], capture_output=True, text=True)
    assert json.loads(out.stdout) == {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]},
                                      "task": {"type": "chief", "index": 0}}


def test_tf_config_evaluator(mgpu):
    result = mgpu("tf-config", "--workers", "h1:2222", "--evaluator", "h9", "--task-type", "evaluator",
                  "--task-index", "0")
    assert result.json() == {"cluster": {"worker": ["h1:2222"]}, "task": {"type": "evaluator", "index": 0}}


@pytest.mark.parametrize("args, message", [
    (["--task-index", "2"], "task index 2 is out of range: the cluster has 2 worker task(s), 0-1"),
    (["--task-index", "0", "--task-type", "chief"], "the cluster has no chief task"),
    (["--task-index", "0", "--task-type", "ps"], "the cluster has no ps task"),
    (["--task-index", "-1"], "-1 is not in the range"),
    ([], "give --task-index (or --from-slurm inside a Slurm job step)"),
    (["--task-index", "0", "--format", "yaml"], "'yaml' is not one of"),
])
def test_tf_config_errors(mgpu, args, message):
    result = mgpu("tf-config", "--workers", "h1:2222,h2:2222", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["launch", "tf-config", "check"])
def test_every_command_has_help_with_examples(mgpu, command):
    result = mgpu(command, "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.stdout


def test_top_level_help_and_version(mgpu):
    assert "Examples:" in mgpu("--help").stdout
    result = mgpu("--version")
    assert result.exit_code == 0 and launcher.__version__ in result.stdout


def test_errors_are_one_line_and_debug_adds_the_traceback(mgpu, tmp_path):
    result = mgpu("launch", "--spec", str(tmp_path), "--dry-run")
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    result = mgpu("--debug", "launch", "--workers", "h1:2222", "--port", "1", "--forward-env", "NOT_SET_ANYWHERE_X")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "NOT_SET_ANYWHERE_X is not set" in result.stderr


def installed_mgpu():
    found = pathlib.Path(sys.executable).parent / "mgpu"
    return str(found) if found.exists() else shutil.which("mgpu")


@pytest.mark.parametrize("args", [
    ["--help"],
    ["launch", "--help"],
    ["launch", "--local", "2", "--chief", "--evaluator", "--dry-run"],
    ["launch", "--workers", "h1:2222,h2:2222", "--dry-run", "--json"],
    ["launch", "--spec", str(REPO / "cluster_specs" / "per_host_ssh.yaml"), "--dry-run"],
    ["tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1"],
    ["tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1", "--format", "keras-env"],
    ["train", "--help"],
])
def test_installed_cli_never_imports_tensorflow(poisoned_tensorflow, args):
    env = dict(os.environ, PYTHONPATH=poisoned_tensorflow)
    done = subprocess.run([installed_mgpu(), *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "must not be imported" not in done.stderr


def test_the_cli_imports_pyyaml_and_python_dotenv_only_to_read_or_write_their_files(tmp_path):
    """A fifth of every command's start: imported with the CLI, they would slow `mgpu status` as
    much as a launch from a spec. Stand-ins leave a file when imported."""
    yaml_loaded, dotenv_loaded = tmp_path / "yaml-loaded", tmp_path / "dotenv-loaded"
    stand_in(tmp_path, "yaml", yaml_loaded, importable=False)
    path = stand_in(tmp_path, "dotenv", dotenv_loaded, importable=False)
    env = dict(os.environ, PYTHONPATH=path)
    for args in (["--version"], ["launch", "--local", "2", "--chief", "--dry-run"], ["status", "--help"],
                 ["k8s", "--help"]):
        done = subprocess.run([installed_mgpu(), *args], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
    assert not yaml_loaded.exists() and not dotenv_loaded.exists()
    # The stand-ins are what the CLI finds when it does read an env file.
    env_file = tmp_path / "run.env"
    env_file.write_text("A=1\n")
    done = subprocess.run([installed_mgpu(), "launch", "--local", "1", "--env-file", str(env_file), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert dotenv_loaded.exists(), done.stderr


def test_a_run_on_this_machine_alone_never_imports_paramiko(tmp_path):
    """The SSH side (paramiko, a tenth of a second with its cryptography) is for remote hosts: a
    stand-in leaves a file when imported."""
    loaded = tmp_path / "paramiko-loaded"
    env = dict(os.environ, PYTHONPATH=stand_in(tmp_path, "paramiko", loaded, importable=False))
    done = subprocess.run([installed_mgpu(), "launch", "--local", "1", "--log-dir", str(tmp_path / "runs"), "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not loaded.exists(), done.stderr


def test_installed_cli_bad_input_exit_2_no_traceback():
    done = subprocess.run([installed_mgpu(), "launch", "--workers", "h1:0", "--dry-run"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("mgpu: error: Invalid value for '--workers': "
                                   "'h1:0': port 0 is out of range (1-65535)")


def test_python_dash_m_launcher():
    done = run_mgpu("tf-config", "--workers", "h1:2222", "--task-index", "0", cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["task"] == {"type": "worker", "index": 0}


def check_this_machine(poisoned_tensorflow, *command):
    """`mgpu check` of a one-worker cluster on this machine, where TensorFlow does not import."""
    from launcher.host.ports import pick_free_ports

    env = dict(os.environ, PYTHONPATH=poisoned_tensorflow)
    return subprocess.run([installed_mgpu(), "check", "--workers", f"127.0.0.1:{pick_free_ports(1)[0]}", *command],
                          capture_output=True, text=True, env=env, timeout=60)


def test_check_demands_tensorflow_for_the_built_in_trainer(poisoned_tensorflow):
    done = check_this_machine(poisoned_tensorflow)
    assert done.returncode == 1
    assert "tensorflow does not import: tensorflow must not be imported here" in done.stderr


def test_check_shows_but_does_not_demand_tensorflow_for_another_program(poisoned_tensorflow):
    """A Keras 3 program on the JAX backend, for one, runs on hosts without TensorFlow: the check
    shows the installed version from its package metadata, and never imports TensorFlow (which
    takes seconds on every host), so the poisoned one passes."""
    from launcher.preflight.check import local_tensorflow_version

    done = check_this_machine(poisoned_tensorflow, sys.executable, str(REPO / "examples" / "keras_jax_fit.py"))
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()
    assert row.split()[4] == (local_tensorflow_version() or "missing") and row.endswith("ok")

