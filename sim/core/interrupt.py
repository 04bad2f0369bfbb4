"""SIGTERM and SIGINT (Ctrl-C) as an exception in the main thread, so a long command unwinds: its `finally`
blocks stop worker processes and remove temporary folders, and sim/cli/main.py prints one line and exits
128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from meshsim.sim.core.errors import CommandFailed

HANDLED = (signal.SIGTERM, signal.SIGINT)


class Interrupted(CommandFailed):
    """A command stopped by a signal; exit status 128 + signum."""

    def __init__(self, signum: int, what: str = ""):
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name}{': ' + what if what else ''}", exit_code=128 + signum)


@contextmanager
def signals_raise(factory: Callable[[int], BaseException] = Interrupted) -> Iterator[None]:
    """Inside the block (main thread only), SIGTERM and SIGINT raise factory(signum)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise factory(signum)

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
