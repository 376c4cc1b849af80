"""Typed errors. Each carries the exit code the CLI returns for it."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class MgpuError(Exception):
    """An error with a one-line message meant for the user."""

    exit_code = EXIT_FAILED


class UsageError(MgpuError):
    """Bad input: options, host lists, spec files. Nothing has been started."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A cluster spec that cannot be planned."""


class ConnectError(MgpuError):
    """A host that cannot be reached or logged into."""


class HostKeyError(ConnectError):
    """An unknown or changed SSH host key."""


class CheckFailed(MgpuError):
    """A pre-launch host check failed."""


class TaskFailed(MgpuError):
    """A task exited non-zero, died by a signal, or never became ready."""


class Interrupted(MgpuError):
    """The launcher was stopped by a signal; the exit code is 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum


class UnreadableAnswer(CheckFailed):
    """A host answered a check with something mgpu cannot read: too long, not JSON mgpu reads, or of
    the wrong shape. The host fails its check."""


class OutputClosed(MgpuError):
    """Standard output's reader went away while mgpu wrote to it (a pipe into a program that
    ended): what a command is killed with by SIGPIPE, as a shell reports it."""

    exit_code = 128 + 13  # SIGPIPE
