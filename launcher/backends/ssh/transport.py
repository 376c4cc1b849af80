"""The one place mgpu reaches into paramiko's private API, and the log of mgpu's own connections.

paramiko ignores the SSH "exit-signal" channel request, so a remote task killed by a signal
would report no status at all. The only hook is Transport's private handler table
(`_channel_handler_table`), which this module extends; setup.cfg bounds paramiko's version
to the series this was checked against, and tests/ssh covers the signal status.
"""

from __future__ import annotations

import logging
import signal

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

# The log channel of mgpu's connections. paramiko logs every failed handshake with a traceback;
# mgpu reports them as one line instead, so this channel (and only this one: a program that
# imports mgpu keeps its own paramiko logging) is silent unless --debug asks for it.
LOG_CHANNEL = "mgpu.ssh"
_log = logging.getLogger(LOG_CHANNEL)
_log.addHandler(logging.NullHandler())
_log.propagate = False


def enable_debug_logging() -> None:
    """Let the log of mgpu's connections (handshakes, tracebacks) through to stderr, for --debug."""
    if not any(isinstance(h, logging.StreamHandler) for h in _log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("paramiko: %(levelname)s %(message)s"))
        _log.addHandler(handler)
    _log.setLevel(logging.DEBUG)


class SignalStatusTransport(paramiko.Transport):
    """A Transport that also records the SSH "exit-signal" request paramiko ignores,
    so a remote task killed by signal N reports -N like a local one."""

    def _handle_channel_request(chan, m):  # noqa: N805 - called as table[ptype](chan, m)
        start = m.packet.tell()
        signalled = False
        try:
            if m.get_text() == "exit-signal":
                m.get_boolean()  # want_reply
                name = m.get_text()
                try:
                    chan.mgpu_exit_signal = int(signal.Signals["SIG" + name])
                except KeyError:  # a signal this system has no name for
                    chan.mgpu_exit_signal = int(signal.SIGKILL)
                signalled = True
        except Exception:
            pass
        m.packet.seek(start)
        paramiko.Channel._handle_request(chan, m)
        if signalled:
            # As paramiko does for exit-status: the task has ended even while the channel stays open
            # (a child that left its group can hold the task's output open).
            chan.status_event.set()

    _channel_handler_table = {
        **paramiko.Transport._channel_handler_table,
        MSG_CHANNEL_REQUEST: _handle_channel_request,
    }
