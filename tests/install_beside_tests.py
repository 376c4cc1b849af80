"""`make test` where the venv has mgpu but not yet its frameworks (a fresh clone): installs TensorFlow,
torch, JAX and the rest while the fast tests already run.

That install takes half a minute and more, mostly on one core (unpacking 3.5 GB), and the fast tests
(`pytest -m fast`: the pure parts, about 40 CPU-s) need none of it, so the Makefile starts them first,
beside it, and the rest of the suite once it is done. The install leaves every package already in
the venv as it is (each held to its installed version), as the fast tests may be importing it; should
the frameworks need another version of one, the install waits for the fast tests to end and is done
again without that hold. The fast tests import no framework meanwhile (needs.WHILE_INSTALLING).

Usage: python tests/install_beside_tests.py MARKER FAST_TESTS_PID EXTRA...   (with the venv's
Python, in the repository; MARKER: the file touched once everything is installed)
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import subprocess
import sys
import time

INSTALL_TIMEOUT = 3600  # seconds: a cold pip cache downloads some GB
PIP_INSTALL = [sys.executable, "-m", "pip", "install", "--quiet", "--quiet", "--no-compile"]


def requirements_of(extras: list[str]) -> list[str]:
    """mgpu's requirements for `extras`, from its installed metadata, without mgpu itself: installing
    `-e .[extras]` would install mgpu again, and a test starting a process meanwhile would not find it."""
    wanted = {extra.lower() for extra in extras}
    found = []
    for requirement in importlib.metadata.requires("mgpu") or ():
        spec, _, marker = requirement.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra and extra.group(1).lower() in wanted:
            found.append(spec.strip())
    return found


def running(pid: int) -> bool:
    """Whether process `pid` runs: an ended one its parent (the Makefile's shell, which waits for it
    only later) has not reaped yet stays in /proc as a zombie."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] != "Z"


def wait_for_exit(pid: int, timeout: float) -> None:
    """Until process `pid` (not a child of this one) has ended."""
    deadline = time.monotonic() + timeout
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.5)


def main(marker: pathlib.Path, fast_tests: int, extras: list[str]) -> int:
    held = pathlib.Path(sys.prefix) / "held-while-testing.txt"
    held.write_text(subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                                   capture_output=True, text=True, check=True).stdout)
    try:
        installed = subprocess.run([*PIP_INSTALL, "-c", str(held), *requirements_of(extras)],
                                   timeout=INSTALL_TIMEOUT).returncode
    except subprocess.TimeoutExpired:
        installed = -1
    if installed != 0:
        print("== the frameworks need other versions of packages in the venv: installing them once the "
              "fast tests have ended", flush=True)
        wait_for_exit(fast_tests, INSTALL_TIMEOUT)
        installed = subprocess.run([*PIP_INSTALL, "-e", f".[{','.join(extras)}]"]).returncode
    if installed != 0:
        return 2
    marker.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
