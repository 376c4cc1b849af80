"""Which signals turn a graceful stop into a kill-now: the rule alone, on lists of signals."""

import signal

import pytest

from launcher.supervise.signals import Signals

INT, TERM = signal.SIGINT, signal.SIGTERM


@pytest.mark.parametrize("received, seen, kill_now", [
    ([INT, INT], 1, True),    # Ctrl-C twice
    ([TERM, INT], 2, True),   # mgpu stop --now, both in before the stop began
    ([INT, TERM], 2, True),   # ... handed over by the kernel in the other order
    ([TERM, INT], 1, True),   # ... its SIGINT during the stop
    ([TERM, TERM], 1, False),  # two mgpu stop: the second waits for the first
    ([TERM, TERM], 2, False),
    ([INT], 0, True),         # Ctrl-C during a stop that a failure began
    ([TERM], 0, False),       # mgpu stop during a stop that a failure began: it waits
    ([INT], 1, False),        # the Ctrl-C that began the stop
    ([TERM], 1, False),
])
def test_only_a_sigint_with_another_signal_or_during_the_stop_kills_now(received, seen, kill_now):
    signals = Signals()
    signals.received.extend(received)
    assert signals.kill_now(seen) is kill_now
