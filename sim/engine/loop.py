"""The engine's discrete-event loop: generator processes, timeouts, events with callbacks, all-of.

A small replacement for the part of simpy the engine used (simpy 4: `Environment`, `Event.succeed`,
`Timeout`, `Process`, `AllOf`), with simpy's ordering so event logs stay bit-identical:

- Every scheduled event is a heap entry (time, priority, sequence number); the loop always processes
  the smallest. Priority URGENT (0) before NORMAL (1) at equal time; the sequence number counts every
  schedule call, so events of equal time and priority run in the order they were scheduled (triggered).
- `timeout(d)` schedules at now + d (the same float sum simpy computes), NORMAL. `succeed(ev)` schedules
  `ev` at now, NORMAL. `process(gen)` schedules the generator's first step at now, URGENT.
- Processing an event sets now to its time, detaches its callback list and calls the callbacks in the
  order they were added. A process waiting on an event is one such callback: it resumes its generator
  until it yields an event not yet processed (callbacks still a list; it appends itself and stops) or
  ends. Yielding an already processed event continues at once, without a round through the heap.
- `all_of(evs)` is an event that succeeds (scheduled at now, NORMAL) when the last of `evs` is
  processed; at once if `evs` is empty or all are already processed.

simpy also schedules an event when a process ends (its own completion). Nobody here waits on a process,
so that event has no callbacks and its time is now; dropping it leaves the relative order of every other
event unchanged (sequence numbers only compare, never count). Values sent into generators are always
None (the engine never reads them). tests/test_engine_loop.py checks the event logs against simpy.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from heapq import heappop, heappush
from itertools import count

URGENT = 0
NORMAL = 1


class Signal:
    """An event: pending while `callbacks` is a list, processed once the loop set it to None."""

    __slots__ = ("callbacks",)

    def __init__(self) -> None:
        self.callbacks: list[Callable[[Signal], None]] | None = []


Process = Generator[Signal, None, object]


class Loop:
    """Runs generator processes in simulated time (module docstring: the ordering rule)."""

    __slots__ = ("now", "_queue", "_seq")

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, int, Signal]] = []
        self._seq = count()

    event = staticmethod(Signal)  # a new pending event

    def succeed(self, ev: Signal) -> None:
        """Trigger `ev`: its callbacks run when the loop reaches it (now, NORMAL)."""
        heappush(self._queue, (self.now, NORMAL, next(self._seq), ev))

    def timeout(self, delay_s: float) -> Signal:
        """An event processed `delay_s` from now."""
        if delay_s < 0:
            raise ValueError(f"negative delay {delay_s}")
        ev = Signal()
        heappush(self._queue, (self.now + delay_s, NORMAL, next(self._seq), ev))
        return ev

    def process(self, gen: Process) -> None:
        """Start `gen` now (URGENT): it runs until it yields an unprocessed event, then waits for it."""
        send = gen.send

        def resume(_ev: Signal) -> None:
            while True:
                try:
                    ev = send(None)
                except StopIteration:
                    return
                callbacks = ev.callbacks
                if callbacks is not None:
                    callbacks.append(resume)
                    return

        start = Signal()
        start.callbacks.append(resume)
        heappush(self._queue, (self.now, URGENT, next(self._seq), start))

    def all_of(self, evs: Sequence[Signal]) -> Signal:
        """An event that succeeds when every one of `evs` has been processed."""
        done = Signal()
        left = [len(evs)]
        if not evs:
            self.succeed(done)
            return done

        def check(_ev: Signal) -> None:
            left[0] -= 1
            if left[0] == 0:
                self.succeed(done)

        for ev in evs:
            if ev.callbacks is None:
                check(ev)
            else:
                ev.callbacks.append(check)
        return done

    def run(self) -> None:
        """Process events until none is left."""
        queue = self._queue
        while queue:
            self.now, _, _, ev = heappop(queue)
            callbacks, ev.callbacks = ev.callbacks, None
            for callback in callbacks:
                callback(ev)
