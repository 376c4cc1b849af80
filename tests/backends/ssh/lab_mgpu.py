"""The one way the SSH tests run the real `mgpu` against the hosts they start (launching.py's
run_mgpu and start_mgpu, with the environment those hosts need): `run` to its end, `start` to
watch it; `ssh_files` names a lab's ssh config and known_hosts on the command line."""

from __future__ import annotations

import subprocess

from launching import mgpu_env, run_mgpu, start_mgpu
from ssh_helpers import SshLab


def env(**extra: str) -> dict[str, str]:
    """launching.mgpu_env() without an ssh-agent: mgpu logs in with the keys the lab's ssh config
    names, never with whatever an agent of the machine holds."""
    environment = mgpu_env(**extra)
    environment.pop("SSH_AUTH_SOCK", None)
    return environment


def ssh_files(lab) -> list[str]:
    """--ssh-config and --known-hosts of an SshLab, or of a namespace lab's fixture (lab, known_hosts,
    ssh_config, ...)."""
    if isinstance(lab, SshLab):
        return ["--ssh-config", str(lab.ssh_config), "--known-hosts", str(lab.known_hosts)]
    _, known, config, *_ = lab
    return ["--ssh-config", str(config), "--known-hosts", str(known)]


def run(cwd, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`mgpu ARGS...` run to its end within `timeout` seconds; stdout and stderr apart, as text."""
    return run_mgpu(*args, cwd=cwd, env=env(), timeout=timeout)


def start(cwd, *args: str, **popen) -> subprocess.Popen:
    """`mgpu ARGS...` started; unless given, stdout and stderr are two pipes of bytes. Other keywords
    go to subprocess.Popen."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", False)
    return start_mgpu(*args, cwd=cwd, env=env(), **popen)
