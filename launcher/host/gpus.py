"""How many GPUs this machine has, as nvidia-smi lists them."""

from __future__ import annotations

from launcher.host.probe import gpu_count

DETECT_TIMEOUT = 10.0


def detect_gpus(timeout: float = DETECT_TIMEOUT) -> int:
    """How many NVIDIA GPUs this machine has; 0 if nvidia-smi is missing, fails or hangs."""
    return gpu_count(timeout) or 0
