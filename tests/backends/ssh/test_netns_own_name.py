"""A JAX program across hosts whose own name resolves to a loopback address there (Debian's
/etc/hosts makes it 127.0.1.1): JAX's Gloo collectives would listen there and every other process
time out after minutes with a bare 'Connect timeout'. The host check finds it, and the launch is
refused in one line before any task starts, naming the fix. (In these namespaces the hosts share
this machine's name, which resolves nowhere until a hosts file names it: the first test gives each
host Debian's line for it.)"""

from __future__ import annotations

import pathlib
import socket

import pytest

import lab_mgpu
import needs
from launching import REPO
from ssh_helpers import PYTHON, run_processes, unique_run_id

pytestmark = [pytest.mark.ssh, pytest.mark.netns, pytest.mark.timeout(120)]


def _launch_jax(netns, tmp_path, run_id):
    return lab_mgpu.run(tmp_path, "launch", *lab_mgpu.ssh_files(netns), "--workers", "h1:2222,h2:2222",
                        "--workdir", str(tmp_path), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                        "--start-timeout", "60", "--", PYTHON, str(REPO / "tests" / "programs" / "jax_psum.py"), "0",
                        timeout=100)


@pytest.fixture
def own_names_on_loopback(netns):
    """Each host's hosts file says `127.0.1.1 NAME` for its own name, as Debian's installer writes it."""
    lab, *_ = netns
    paths = [pathlib.Path(f"/etc/netns/{ns}/hosts") for ns in lab.namespaces.values()]
    originals = {path: path.read_text() for path in paths}
    for path, text in originals.items():  # rewritten in place: the namespaces' mounts see it
        path.write_text(f"127.0.1.1 {socket.gethostname()}\n" + text)
    try:
        yield
    finally:
        for path, text in originals.items():
            path.write_text(text)


def test_a_jax_program_is_refused_where_the_hosts_own_names_are_loopback(netns, own_names_on_loopback, tmp_path):
    needs.require("jax")
    run_id = unique_run_id("netns-own-name")
    done = _launch_jax(netns, tmp_path, run_id)
    name = socket.gethostname()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("mgpu: error:")]
    assert errors == ["mgpu: error: check failed on 2 hosts: h1, h2"], done.stderr[-3000:]
    problem = (f"its own name {name} resolves to 127.0.1.1 there, where JAX's Gloo collectives would listen and no "
               f"other host can reach them (they time out after minutes): map {name} to the address the other hosts "
               "reach in its /etc/hosts (not 127.0.1.1)")
    assert [line for line in done.stderr.splitlines() if line.endswith(problem)] != [], done.stderr[-3000:]
    assert not (tmp_path / "runs" / run_id / "worker-0.log").exists()  # no task started
    assert not run_processes(run_id)


def test_a_jax_program_is_refused_where_a_hosts_own_name_does_not_resolve(netns, tmp_path):
    needs.require("jax")
    run_id = unique_run_id("netns-own-name")
    done = _launch_jax(netns, tmp_path, run_id)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"its own name {socket.gethostname()} does not resolve there (" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "runs" / run_id / "worker-0.log").exists()
    assert not run_processes(run_id)
