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


class _Section:
    """Whether the main thread is inside a `deferred` block, and a signal that arrived meanwhile."""

    depth = 0
    pending: BaseException | None = None


@contextmanager
def signals_raise(factory: Callable[[int], BaseException] = Interrupted) -> Iterator[None]:
    """Inside the block (main thread only), SIGTERM and SIGINT raise factory(signum), at once or, inside a
    `deferred` block, when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _Section.depth:
            _Section.pending = _Section.pending or factory(signum)
            return
        raise factory(signum)

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def deferred() -> Iterator[None]:
    """A block a signal must not cut in two (a record stored and counted together): a signal that arrives
    inside it is raised when it ends. Python runs signal handlers in the main thread whichever thread the
    kernel delivered the signal to, so a flag the handler reads is exact where a signal mask (per thread:
    a process pool's threads do not share it) is not."""
    _Section.depth += 1
    try:
        yield
    finally:
        _Section.depth -= 1
        if not _Section.depth and _Section.pending is not None:
            stop, _Section.pending = _Section.pending, None
            raise stop
