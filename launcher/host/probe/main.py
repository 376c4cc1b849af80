"""The probe's command line: which of its parts run, in which order, and its one JSON answer.

The probe runs with the task's Python on every host (over SSH for remote ones) as one source,
`python -c SOURCE ARGS` (see __init__.py), or here as `python -m launcher.host.probe.main ARGS`.

Run as: probe PORTS MODULES [legacy-keras] [import-tensorflow], with comma-separated
lists; prints one JSON object with the keys python, busy_ports, missing_modules, tensorflow or
tensorflow_error, gpus, and with legacy-keras also tf_keras or tf_keras_error. TensorFlow's
and tf_keras's versions are read from their package metadata; with import-tensorflow (`mgpu
check`, where the tasks need it) both are imported too, which takes seconds, so that an
installation that is there but broken is found.

Or as: probe reach PORTS TARGETS TIMEOUT EXPECTED, the reachability test that the
launcher runs on every host at once: listen on PORTS (this host's tasks), connect to every
TARGET (host:port, comma-separated: every task's TF_CONFIG address), an attempt failing when
unanswered for TIMEOUT seconds and a refused one tried again for REACH_WAIT x TIMEOUT, and keep
listening until each port has accepted EXPECTED connections (one per host that dials it:
comma-separated per port, or one count for all) or, once its own dials are done, REACH_LINGER
seconds more (TIMEOUT more again where one of them failed). Once its own dials are done it prints
the line DIALED; a line ALL_DIALED on its stdin (the launcher's word that every host has dialed) ends
the listening at once: no dial is still to come. Then it prints one JSON object: listen_errors
{port: reason}, reach {target: "ok" | reason}, dialed {target: the IP address it resolved to
here}, and addresses [[address, interface], ...] of this host: from the addresses the other
hosts dialed, the launcher finds the interface of each host that NCCL and Gloo must use.

Both in one process: probe reach PORTS TARGETS TIMEOUT EXPECTED check PORTS MODULES
[flags]: the reachability test, then the host check, whose JSON object it prints with the
test's under the key reach. One SSH session per host instead of two, and the test starts
before anything slow (importing TensorFlow) so that the hosts' listeners are up together.

Or as: probe speed PORT TARGET TIMEOUT, the speed probe: listen on PORT (this host's
first task port) for the previous host of a ring, send to TARGET (the next host's first task
address) for about TRANSFER_SECONDS in rounds (connection attempts, and a first round that the
neighbour's reachability test's listener closed, tried again for TIMEOUT seconds: the hosts come
to it at different times), then time a fixed matrix product on one core with numpy, the best of
SPEED_WINDOWS windows of SPEED_WINDOW seconds (and on the first GPU with torch or TensorFlow,
where nvidia-smi lists one). PORT and TARGET are "-" on a lone host. Prints one JSON object:
cpu_gflops, gpu_gflops, send_mbps (null where not measured) and, for what could not be,
cpu_error, gpu_error and send_error. It may end any other mode (`reach ... check ... speed PORT
TARGET TIMEOUT`, `reach ... speed ...`): it runs last, in the same process (so the launch needs
no other SSH session for it), its answer under the key speed; numpy's threads are kept to one
before the host check can import it with TensorFlow.
"""

import json
import os
import sys
import threading

from launcher.host.gpus import gpu_count
from launcher.host.probe.host_check import host_check_of
from launcher.host.probe.reach_test import DIALED, reach, wait_for_all_dialed
from launcher.host.probe.speed_probe import ONE_THREAD_ENV, speed_stage


def main(argv):
    """Run the parts `argv` asks for (see above) and print their one JSON answer."""
    args = argv[1:]
    speed_args = None
    if len(args) >= 4 and args[-4] == "speed":  # always last, with its three arguments
        args, speed_args = args[:-4], args[-3:]
        for name in ONE_THREAD_ENV:  # before anything imports numpy (TensorFlow, in the host check)
            os.environ[name] = "1"
    if args[:1] == ["reach"]:
        ports = [int(port) for port in args[1].split(",") if port]
        targets = [target for target in args[2].split(",") if target]
        counts = [int(count) for count in args[4].split(",")]  # per port, or one for every port
        all_dialed = threading.Event()
        threading.Thread(target=wait_for_all_dialed, args=(0, all_dialed), daemon=True).start()
        reached = reach(ports, targets, float(args[3]), dict(zip(ports, counts * len(ports) if len(counts) == 1 else counts)),
                        all_dialed, lambda: print(DIALED, flush=True))
        if args[5:6] == ["check"]:
            result = host_check_of(args[6:])
            result["reach"] = reached
        else:
            result = reached
    elif args:
        result = host_check_of(args)
    else:
        result = None
    if speed_args is not None:
        gpus = result.get("gpus") if result is not None and "gpus" in result else gpu_count(timeout=10.0)
        measured = speed_stage(speed_args, gpus)
        if result is None:
            result = measured
        else:
            result["speed"] = measured
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
