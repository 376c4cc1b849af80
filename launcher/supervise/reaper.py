"""The guard of a run's record: if the launcher dies, the run is recorded as launcher-died and the
run's processes on this machine are stopped.

The supervisor starts one reaper per run, whatever runs its tasks, and keeps the write end of a pipe to its
stdin. Nothing is ever written until the launcher finishes cleanly and sends
DONE. If the launcher dies instead (even by SIGKILL), the kernel closes the pipe,
the reaper reads end-of-file and stops every process tagged with the run id and the
launch's id, or no launch id (protocol.ENV_LAUNCH_ID: not a later launch's that reuses the run id):
TERM, a grace period, then KILL; then it writes the run's final status to run.json
(launcher-died). The reaper lives in its own session, so a terminal's Ctrl-C or
hang-up does not reach it. It inherits the run dir's descriptor, so it writes
there as the launcher does: by name under that descriptor, never through a path.

Run as: python -m launcher.supervise.reaper RUN_ID GRACE_SECONDS RUN_DIR_FD RUN_DIR [LAUNCH_ID]

A program of its own: the one module of supervise/ that looks at this machine's processes itself
(host/proctree), since the launcher, and with it the backends, is gone when it acts.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

from launcher.supervise.rundir import RunDir

DONE = b"done"
LOG_NAME = "reaper.log"


class Reaper:
    """The launcher's handle on its reaper process."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    @classmethod
    def start(cls, run_id: str, grace: float, run_dir: RunDir, launch_id: str | None = None) -> "Reaper":
        """A reaper for the run (for the launch `launch_id`'s processes only, if given), logging to
        reaper.log in `run_dir`."""
        package_parent = str(pathlib.Path(__file__).resolve().parents[2])
        code = f"import sys; sys.path.insert(0, {package_parent!r}); from launcher.supervise.reaper import main; main()"
        # Continued by the run's reaper after the one that guards its --setup.
        with open(run_dir.open_log(LOG_NAME), "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", code, run_id, str(grace), str(run_dir.fd), str(run_dir.path),
                 *([launch_id] if launch_id else [])],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                start_new_session=True,
                pass_fds=(run_dir.fd,),
            )
        return cls(proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def dismiss(self, timeout: float = 5.0) -> None:
        """Tell the reaper the run ended cleanly, and wait for it to exit."""
        try:
            self._proc.stdin.write(DONE)
            self._proc.stdin.close()
        except OSError:  # it died; nothing to tell
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def main(argv: list[str] | None = None) -> int:
    from launcher.host import proctree
    from launcher.supervise import runrecord  # the record is the launcher's to write, but it is gone

    args = argv or sys.argv[1:]
    run_id, grace, run_dir_fd, run_dir_path = args[:4]
    launch_id = args[4] if len(args) > 4 else None
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    message = sys.stdin.buffer.read()  # returns when the launcher closes the pipe or dies
    if message == DONE:
        return 0
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    stopped = proctree.stop_run(run_id, float(grace), launch_id=launch_id)
    runrecord.record_launcher_died(
        RunDir(pathlib.Path(run_dir_path), int(run_dir_fd)),
        f"the launcher died before the run ended; its reaper stopped {stopped} processes of the run on this machine")
    # Last: whoever reads this line finds the record already written.
    print(f"{started} launcher gone (reaper pid {os.getpid()}); stopped {stopped} processes of run {run_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
