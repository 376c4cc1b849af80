"""How many GPUs this machine has, as nvidia-smi lists them.

Standard library only, importing nothing of mgpu: the probe (launcher/host/probe/) ships this
source to every host, so a host's GPUs are counted there as they are here.
"""

import shutil
import subprocess

DETECT_TIMEOUT = 10.0


def count_gpus_in_listing(text):
    """The number of GPUs in the output of `nvidia-smi -L` ("GPU 0: ... (UUID: ...)" per line)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


def gpu_count(timeout=10.0):
    """How many NVIDIA GPUs this host has; None without nvidia-smi, 0 if it fails or hangs."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "-L"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return count_gpus_in_listing(done.stdout) if done.returncode == 0 else 0


def detect_gpus(timeout=DETECT_TIMEOUT):
    """How many NVIDIA GPUs this machine has; 0 if nvidia-smi is missing, fails or hangs."""
    return gpu_count(timeout) or 0
