"""period_proof._maybe_changed picks, with numpy, the ops whose state check can fail (phase at c1 differs
from its image's at c2, or both are running): a differential test against period_state.phase on
generated times that sit on the cuts, a hair either side of them, or far away."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.engine.events import Event
from meshsim.sim.results.period_proof import _maybe_changed
from meshsim.sim.results.period_state import RUNNING, Cut, phase

C1, T = 1.0, 0.5
NEAR = (-1.0, -1e-12, -5e-324, 0.0, 5e-324, 1e-12, 1.0)


def event(op_id: int, start_s: float, end_s: float) -> Event:
    return Event(0, op_id, f"op{op_id}", "compute", "compute", "fwd", 0, 0, start_s, end_s)


@settings(max_examples=300, deadline=None)
@given(times=st.lists(st.tuples(st.sampled_from(NEAR), st.sampled_from(NEAR), st.booleans()), min_size=1,
                      max_size=14),
       p=st.integers(1, 4), lo=st.integers(0, 3))
def test_maybe_changed_equals_phase_by_phase(times, p, lo):
    cut = Cut(C1, T, 1e-9, 0.0)
    ev = {}
    for i, (a, b, later) in enumerate(times):
        c = cut.c2 if later else cut.c1
        start, end = sorted((c + a, c + b))
        ev[i] = event(i, start, end)
    hi = len(times) - p
    picked = _maybe_changed(ev, lo, hi, p, cut)
    expected = [i for i in range(lo, hi)
                if phase(ev[i].start_s, ev[i].end_s, cut.c1) != phase(ev[i + p].start_s, ev[i + p].end_s, cut.c2)
                or phase(ev[i].start_s, ev[i].end_s, cut.c1) == RUNNING]
    assert picked == expected
