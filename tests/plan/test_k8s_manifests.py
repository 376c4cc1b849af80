"""`mgpu k8s`: the manifests, byte for byte against golden files, valid against the Kubernetes API
schema (kubernetes-validate, offline), and bad input refused in one line with exit 2."""

from __future__ import annotations

import os
import pathlib
import re

import pytest
import yaml
from launching import REPO
from needs import require

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden_k8s"
IMAGE = "registry.example.com/train:1"
KUBERNETES = "1.33"  # Indexed Jobs with pod hostnames, podFailurePolicy and backoff per index are GA there

CASES = {
    "workers": ["--workers", "2", "--image", IMAGE],
    "chief_gpus_env": ["--workers", "3", "--chief", "--image", IMAGE, "--name", "resnet-run7", "--namespace", "ml",
                       "--gpus-per-task", "1", "--threads-per-task", "4", "--env", "NCCL_DEBUG=INFO",
                       "--backoff-limit", "2", "--", "python3", "train.py", "--epochs", "3"],
    **{f"spec_{name}": ["--spec", str(REPO / "cluster_specs" / f"{name}.yaml"), "--image", IMAGE,
                        "--name", name.replace("_", "-")]
       for name in ("two_workers", "local_simulation", "per_host_ssh")},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_match_their_golden_files(mgpu, case):
    result = mgpu("k8s", *CASES[case])
    assert result.exit_code == 0, result.stderr
    golden = GOLDEN / f"{case}.yaml"
    if os.environ.get("MGPU_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(result.stdout)
    assert result.stdout == golden.read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_are_valid_kubernetes_objects(case):
    kubernetes_validate = require("kubernetes_validate")
    documents = list(yaml.safe_load_all((GOLDEN / f"{case}.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["Service", "Job"]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_the_validator_does_catch_a_wrong_field():
    """So that the test above can fail: a Job with a misspelt field is refused."""
    kubernetes_validate = require("kubernetes_validate")
    job = list(yaml.safe_load_all((GOLDEN / "workers.yaml").read_text()))[1]
    job["spec"]["completionsMode"] = job["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES, strict=True)


def test_the_job_names_pods_in_the_services_subdomain(mgpu):
    result = mgpu("k8s", *CASES["chief_gpus_env"])
    service, job = yaml.safe_load_all(result.stdout)
    pod = job["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"] == "resnet-run7"
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 4, 4)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python3", "-m", "launcher.bootstrap.k8s_pod", "--", "python3", "train.py",
                                    "--epochs", "3"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["MGPU_K8S_TASKS"] == "4" and env["MGPU_K8S_CHIEF"] == "1" and env["NCCL_DEBUG"] == "INFO"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_trainer_arguments_go_to_the_built_in_trainer(mgpu):
    result = mgpu("k8s", "--workers", "2", "--image", IMAGE, "--", "--train-steps", "5")
    job = list(yaml.safe_load_all(result.stdout))[1]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][4:] == [
        "python3", "-m", "launcher.trainer", "--train-steps", "5"]


@pytest.mark.parametrize("args, message", [
    (["--image", IMAGE], "give --workers N (or --spec FILE)"),
    (["--workers", "2"], "Missing option '--image'"),
    (["--workers", "2", "--image", IMAGE, "--name", "Run_7"], "must be DNS labels"),
    (["--workers", "2", "--image", IMAGE, "--name", "a" * 62], "must be DNS labels"),
    (["--workers", "2", "--image", IMAGE, "--env", "TF_CONFIG={}"], "TF_CONFIG is set by mgpu"),
    (["--workers", "2", "--image", IMAGE, "--env", "RANK=3"], "RANK is set by mgpu"),
    (["--workers", "0", "--image", IMAGE], "--workers"),
    (["--spec", str(REPO / "cluster_specs" / "chief_workers_evaluator.yaml"), "--image", IMAGE],
     "an evaluator is not supported on Kubernetes"),
    (["--spec", str(REPO / "cluster_specs" / "two_workers.yaml"), "--workers", "2", "--image", IMAGE],
     "either --spec or --workers"),
    (["--workers", "2", "--image", IMAGE, "--env", "JOB_COMPLETION_INDEX=0"],
     "JOB_COMPLETION_INDEX is set by Kubernetes for each pod"),
    (["--workers", "2", "--image", IMAGE, "--name", "1job"], "starting with a letter"),
    (["--workers", "2", "--image", IMAGE, "--name", "job-"], "must be DNS labels"),
    (["--workers", "2", "--image", IMAGE, "--namespace", "ML_team"], "--namespace 'ML_team': a namespace is a DNS label"),
    (["--workers", "2", "--image", IMAGE, "--namespace", "-ml"], "a namespace is a DNS label"),
    (["--workers", "2", "--image", IMAGE, "--namespace", "n" * 64], "a namespace is a DNS label"),
    (["--workers", "2", "--image", "Registry.example.com/Train:1"], "is not an image reference"),
    (["--workers", "2", "--image", "train:1 --privileged"], "is not an image reference"),
    (["--workers", "2", "--image", ""], "is not an image reference"),
    (["--workers", "2", "--image", "train:"], "is not an image reference"),
    (["--workers", "2", "--image", "a/" * 130 + "b"], "is not an image reference"),
])
def test_bad_input_is_one_line_and_exit_2(mgpu, args, message):
    result = mgpu("k8s", *args)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


@pytest.mark.parametrize("image", ["train", "train:1", "my/train:1.0-rc_2", "localhost:5000/a/b__c", "a.b-c.io/x.y/z",
                                   "reg.example.com/train@sha256:" + "0" * 64, "Reg.Example.com:443/t:latest"])
def test_image_references_as_runtimes_take_them_are_accepted(mgpu, image):
    result = mgpu("k8s", "--workers", "2", "--image", image)
    assert result.exit_code == 0, result.stderr


def test_a_spec_files_env_cannot_set_the_pod_index(mgpu, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("cluster:\n  worker: [a:2222, b:2222]\nenv:\n  JOB_COMPLETION_INDEX: '0'\n")
    result = mgpu("k8s", "--spec", str(spec), "--image", IMAGE)
    assert result.exit_code == 2 and "JOB_COMPLETION_INDEX is set by Kubernetes" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


class Yaml11Loader(yaml.SafeLoader):
    """Booleans as YAML 1.1 has them, y and n included (PyYAML leaves those out; kubectl's reader,
    and so the API server's, takes them)."""


Yaml11Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"))


def test_every_string_stays_a_string_for_a_yaml_1_1_reader(mgpu):
    values = ["y", "n", "Yes", "off", "ON", "~", "null", "0x1f", "1e3", "012", "1_000", ".inf", "2001-12-14", "é", ""]
    env = [arg for i, value in enumerate(values) for arg in ("--env", f"V{i}={value}")]
    result = mgpu("k8s", "--workers", "2", "--image", IMAGE, "--name", "n", *env, "--", "y", *values)
    assert result.exit_code == 0, result.stderr
    service, job = yaml.load_all(result.stdout, Loader=Yaml11Loader)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][4:] == ["y", *values]
    assert {item["name"]: item["value"] for item in container["env"]}.items() >= {
        f"V{i}": value for i, value in enumerate(values)}.items()
    assert job["metadata"]["name"] == service["metadata"]["name"] == "n"
