"""period_state.time_values takes the run's state-change times with numpy: a differential test against the
loop it replaced, on generated ops, P2P transfers and arbiter jobs whose times sit on the window's ends,
a hair either side, or far away, and ops with and without a rendezvous wait."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.engine.arbiter import Job
from meshsim.sim.engine.events import Event, EventLog
from meshsim.sim.engine.processes import Transfer
from meshsim.sim.results.period_state import time_values

LO, HI = 1.0, 2.0
TIMES = (0.0, LO - 1e-12, LO, LO + 1e-12, 1.5, HI - 1e-12, HI, HI + 1e-12, 3.0)


def time_values_long(log: EventLog, lo: float, hi: float) -> list[float]:
    vals = [v for e in log.events if e.end_s >= lo and e.start_s <= hi
            for v in (e.start_s, e.start_s + e.wait_s, e.end_s)]
    vals += [v for t in (*log.transfers, *log.jobs) if t.end_s >= lo and t.start_s <= hi for v in (t.start_s, t.end_s)]
    return sorted(v for v in vals if lo <= v <= hi)


spans = st.lists(st.tuples(st.sampled_from(TIMES), st.sampled_from(TIMES)).map(sorted), max_size=8)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(TIMES), st.sampled_from(TIMES), st.sampled_from((0.0, 1e-12, 0.3))),
                    max_size=10),
       transfers=spans, jobs=spans)
def test_time_values_equal_the_loop(ops, transfers, jobs):
    events = tuple(Event(0, i, f"op{i}", "compute", "compute", "fwd", 0, 0, min(a, b), max(a, b), w)
                   for i, (a, b, w) in enumerate(ops))
    log = EventLog(events, (0,), 3.0,
                   transfers=tuple(Transfer(0, 1, "fwd", i, 0, a, b) for i, (a, b) in enumerate(transfers)),
                   jobs=tuple(Job((0, i), (0, i), a, b, {}, None) for i, (a, b) in enumerate(jobs)))
    assert time_values(log, LO, HI) == time_values_long(log, LO, HI)
