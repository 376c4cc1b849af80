"""Public-address warnings and OpenSSH-compatible host key names and fingerprints."""

from __future__ import annotations

import subprocess

import pytest

from launcher.backends.ssh import hostkeys
from launcher.preflight.exposure import exposure_warnings, is_public
from launcher.plan.planner import TaskPlan
from ssh_helpers import require_tools


def plan(host: str, port: int | None = 2222, index: int = 0, local: bool = False) -> TaskPlan:
    return TaskPlan("worker" if port else "evaluator", index, host, port, local, None, ("true",),
                    {"TF_CONFIG": "{}"}, None, False)


@pytest.mark.parametrize("address,public", [
    ("10.1.2.3", False), ("192.168.0.5", False), ("172.16.9.9", False), ("127.0.0.1", False),
    ("169.254.1.1", False), ("100.64.0.1", False), ("::1", False), ("fd00::5", False), ("fe80::1", False),
    ("8.8.8.8", True), ("2001:4860::8888", True), ("::ffff:8.8.8.8", True), ("::ffff:10.0.0.1", False),
])
def test_is_public(address, public):
    assert is_public(address) is public


def test_warns_for_public_workers_only():
    plans = [plan("10.0.0.1"), plan("8.8.4.4", index=1), plan("gpu-a", index=2), plan("1.1.1.1", None)]
    warnings = exposure_warnings(plans)
    assert len(warnings) == 1  # private, unresolved name and the evaluator (no port) are not judged
    assert "worker:1" in warnings[0] and "8.8.4.4" in warnings[0] and "--allow-public" in warnings[0]


def test_hostnames_are_judged_by_their_resolved_address():
    resolved = {"gpu-a": "93.184.216.34", "gpu-b": "10.9.9.9"}
    warnings = exposure_warnings([plan("gpu-a"), plan("gpu-b", index=1), plan("localhost", index=2)], resolved.get)
    assert len(warnings) == 1 and "gpu-a (93.184.216.34)" in warnings[0]


def test_local_tasks_are_judged_too():
    """TensorFlow's server listens on every interface, so a local task on this machine's public
    address is as exposed as a remote one. Local names are not resolved."""
    asked = []

    def resolve(name):
        asked.append(name)
        return "93.184.216.34"

    plans = [plan("8.8.4.4", local=True), plan("10.0.0.7", index=1, local=True), plan("this-host", index=2, local=True),
             plan("gpu-a", index=3)]
    warnings = exposure_warnings(plans, resolve)
    assert asked == ["gpu-a"]
    assert len(warnings) == 2
    assert "worker:0 serves TensorFlow on 8.8.4.4 port 2222" in warnings[0]
    assert "worker:3 serves TensorFlow on gpu-a (93.184.216.34) port 2222" in warnings[1]


def test_known_hosts_names():
    assert hostkeys.known_hosts_name("h1", 22) == "h1"
    assert hostkeys.known_hosts_name("10.0.0.1", 2201) == "[10.0.0.1]:2201"


def test_fingerprint_matches_ssh_keygen(tmp_path):
    require_tools("ssh-keygen")
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    import base64

    blob = base64.b64decode((tmp_path / "k.pub").read_text().split()[1])
    expected = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "k.pub")],
                              capture_output=True, text=True, check=True).stdout.split()[1]
    assert hostkeys.sha256_fingerprint(blob) == expected
