"""period_path._before reads the near-last ops finished by a time from the end of the rank's ops sorted by
end, instead of filtering them all: a differential test against the long way on generated end times that
aim at its edges (equal ends, ends exactly 8 TIE_S apart or a hair either side of that, the op itself
among the finished ones or the last of them, t before every end or after all)."""

from __future__ import annotations

from bisect import bisect_right

from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.engine.events import Event
from meshsim.sim.results.critical_path import TIE_S
from meshsim.sim.results.period_path import _before

STEPS = (0.0, TIE_S, 4 * TIE_S, 8 * TIE_S, 8 * TIE_S * (1 + 1e-12), 8 * TIE_S * (1 - 1e-12), 9 * TIE_S, 1e-6)


def before_long(order: list[Event], ev: Event, t_s: float) -> list[Event]:
    """The long way: every op finished by t_s but ev, then those within 8 TIE_S of the last of them."""
    ends = [e.end_s for e in order]
    done = [e for e in order[:bisect_right(ends, t_s)] if e.op_id != ev.op_id]
    if not done:
        return []
    top = done[-1].end_s
    return [e for e in done if e.end_s >= top - 8 * TIE_S]


def event(op_id: int, end_s: float) -> Event:
    return Event(0, op_id, f"op{op_id}", "compute", "compute", "fwd", 0, 0, end_s - 1e-6, end_s)


@settings(max_examples=400, deadline=None)
@given(gaps=st.lists(st.sampled_from(STEPS), min_size=0, max_size=12), base=st.sampled_from((0.0, 1.0, 37.25)),
       which=st.integers(0, 12), t_pick=st.integers(-1, 13), t_nudge=st.sampled_from((0.0, -1e-15, 1e-15)))
def test_before_equals_the_long_way(gaps, base, which, t_pick, t_nudge):
    ends, t = [], base
    for gap in gaps:
        t += gap
        ends.append(t)
    order = sorted((event(i, end) for i, end in enumerate(ends)), key=lambda e: e.end_s)
    ev = order[which] if which < len(order) else event(99, base)
    t_s = (ends[t_pick] if 0 <= t_pick < len(ends) else (base - 1.0 if t_pick < 0 else t + 1.0)) + t_nudge
    assert _before(order, [e.end_s for e in order], ev, t_s) == before_long(order, ev, t_s)
