"""The launcher's terminal during a run: when it hangs up (SIGHUP: closed, or the SSH session to
this machine lost), or a detached run lets it go, the console moves to <run dir>/console.log and
the run goes on."""

from __future__ import annotations

import os
import sys

from launcher.supervise.output import RunOutput
from launcher.supervise.rundir import CONSOLE_LOG, RunDir
from launcher.supervise.signals import Signals


class Terminal:
    def __init__(self, run_dir: RunDir, output: RunOutput, signals: Signals, run_id: str):
        self.run_dir = run_dir
        self.output = output
        self.signals = signals
        self.run_id = run_id
        self.moved = False

    def check_hang_up(self) -> None:
        """SIGHUP: the terminal is gone; the run goes on, its console in console.log."""
        if self.signals.hung_up and not self.moved:
            self.move_console()
            self.output.notice(f"the terminal hung up (SIGHUP); the run goes on: `mgpu status {self.run_id}`, "
                               f"`mgpu stop {self.run_id}`")

    def move_console(self) -> None:
        """From now on the console is <run dir>/console.log: mgpu's own output (standard output and error,
        so its last line too) and the tasks' view; standard input is /dev/null."""
        fd = self.run_dir.open_log(CONSOLE_LOG)
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):  # a terminal already gone: what it held is lost
                    pass
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            self.output.redirect_console(open(fd, "w", encoding="utf-8", errors="replace", closefd=True))
        except BaseException:
            os.close(fd)
            raise
        self.moved = True
