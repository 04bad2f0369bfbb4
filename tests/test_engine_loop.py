"""The engine's event loop (sim/engine/loop.py): simpy's ordering rule on hand-built cases, and whole event
logs bit-identical to the same engine run on simpy itself (the reference it replaced)."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.engine import events
from meshsim.sim.engine.loop import Loop
from meshsim.sim.results.simulate import simulate_with_events


def _recorder(loop, log, name, delay_s, wait=None):
    def proc():
        log.append((name, "start", loop.now))
        if wait is not None:
            yield wait
            log.append((name, "woke", loop.now))
        yield loop.timeout(delay_s)
        log.append((name, "end", loop.now))
    return proc()


def test_ties_run_in_trigger_order_and_starts_are_urgent():
    loop, log = Loop(), []
    gate = loop.event()
    loop.process(_recorder(loop, log, "a", 1.0, wait=gate))
    loop.process(_recorder(loop, log, "b", 1.0))

    def opener():
        yield loop.timeout(0.0)  # NORMAL at t=0: after both starts (URGENT) although scheduled first
        loop.succeed(gate)
        loop.process(_recorder(loop, log, "c", 0.5))  # URGENT at t=0: before a wakes (NORMAL)
    loop.process(opener())
    loop.run()
    assert log == [("a", "start", 0.0), ("b", "start", 0.0), ("c", "start", 0.0), ("a", "woke", 0.0),
                   ("c", "end", 0.5), ("b", "end", 1.0), ("a", "end", 1.0)]


def test_processed_event_continues_at_once_and_all_of():
    loop, log = Loop(), []
    first, second = loop.timeout(2.0), loop.timeout(3.0)

    def waiter():
        yield loop.all_of([first, second])
        log.append(("all", loop.now))
        yield first  # processed already: no round through the heap
        log.append(("again", loop.now))
        yield loop.all_of([])
        log.append(("empty", loop.now))
    loop.process(waiter())
    loop.run()
    assert log == [("all", 3.0), ("again", 3.0), ("empty", 3.0)]
    assert first.callbacks is None and second.callbacks is None


def test_negative_delay_is_refused():
    with pytest.raises(ValueError, match="negative delay"):
        Loop().timeout(-1e-9)


class _SimpyLoop:
    """simpy.Environment behind the Loop interface: the reference ordering."""

    def __init__(self):
        import simpy  # test-only reference (the engine no longer uses it)
        self._env = simpy.Environment(initial_time=0.0)
        self.event, self.timeout, self.all_of = self._env.event, self._env.timeout, self._env.all_of
        self.run = self._env.run

    @property
    def now(self) -> float:
        return self._env.now

    def process(self, gen) -> None:
        self._env.process(gen)

    @staticmethod
    def succeed(ev) -> None:
        ev.succeed()


def _tiny(**overrides):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, overrides, source), source)


CASES = {
    # slow NVLink, long launches: bandwidth parts overlap compute and each other (arbiter), with interference
    "interference": (dict(**{"parallel.gpus": 4, "topology.nvlink_gbps": 1.0,
                             "hardware.compute.launch_overhead_us": 50.0,
                             "hardware.compute.comm_interference": 0.5, "parallel.sp": True,
                             "parallel.tp_comm_overlap": True}), True),
    "interleaved-pp": (dict(**{"parallel.gpus": 8, "parallel.tp": 1, "parallel.sp": False, "parallel.dp": "auto",
                               "model.layers": 8, "parallel.pp": 4, "parallel.vp": 2,
                               "parallel.global_batch": 32}), False),
    "pp-tp": (dict(**{"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": False, "parallel.dp": "auto",
                      "model.layers": 4, "parallel.pp": 2, "parallel.global_batch": 8}), True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_event_log_equals_simpy_reference(case, monkeypatch):
    pytest.importorskip("simpy")
    overrides, explicit = CASES[case]
    rs = _tiny(**overrides)
    _, ours, _ = simulate_with_events(rs, explicit_ranks=explicit)
    monkeypatch.setattr(events, "Loop", _SimpyLoop)
    _, reference, _ = simulate_with_events(rs, explicit_ranks=explicit)
    assert len(ours.events) > 100
    assert ours.events == reference.events  # every field, floats bit for bit, in completion order
