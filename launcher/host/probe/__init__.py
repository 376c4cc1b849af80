"""The probe: the program mgpu runs on every host of a launch, and of `mgpu check`, with the tasks'
own Python: the host check (host_check.py), the reachability test (reach_test.py) and the speed
probe (speed_probe.py), in one process and one SSH session per host; its command line and answer
are main.py's.

Where it runs a host has Python but perhaps not mgpu, so the probe is standard library only and
reaches a host as one source, `probe_source()`: the text of each module of SHIPPED in order, less
its imports of the others (whose names are then defined above it). The host facts it shares with
the launcher (gpus.py, ports_in_use.py, packages.py and interfaces.py, beside this folder) are
shipped with it: whether a port is busy, or which interface holds an address, is answered by the
same code on every host and on this machine. A shipped module imports the standard library and
other shipped modules only, each of those on one line, and no two define the same name at the top
(tests/host/test_probe_program.py holds them to it).
"""

import functools
import pathlib
import re

HOST_FOLDER = pathlib.Path(__file__).resolve().parent.parent  # launcher/host
# In the order they are defined in the one source: each after those it imports.
SHIPPED = ("gpus.py", "ports_in_use.py", "packages.py", "interfaces.py", "probe/program_check.py",
           "probe/host_check.py",
           "probe/reach_test.py", "probe/speed_probe.py", "probe/main.py")
# A shipped module's import of another: left out of the one source, where the names are defined above.
SHIPPED_IMPORT = re.compile(r"^from launcher\.host\.[\w.]+ import [\w, ]+\n", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def probe_source() -> str:
    """The probe as one source, for `python -c`: it runs main.main(sys.argv)."""
    texts = [SHIPPED_IMPORT.sub("", (HOST_FOLDER / name).read_text(encoding="utf-8")) for name in SHIPPED]
    return "\n\n".join(texts)
