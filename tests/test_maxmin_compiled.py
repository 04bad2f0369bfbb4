"""The compiled max-min filling (sim/cost/collectives/_maxmin.pyx) against the Python reference
(maxmin.maxmin_rates_reference): the same floats, bit for bit, on generated inputs aimed at its edges -
resources saturating together (ties: equal capacities and weights, so several resources reach the level at
once and freeze in first-use order), zero and negative capacities, infinite capacities, flows with no
positive demand, mixed key types ("cpu", rank) / link / private -(j+1), and the inputs it hands back to the
reference (not a dict, not a float, NaN). Likewise the compiled phase evaluation (_maxmin.phase_rates) against
phases._phase_rates_reference: merged identical flows, repeated links in a route, zero / infinite capacities
(where the reference divides by zero, the compiled one hands back to it), and the dict order of busy links."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.cost.collectives import maxmin

compiled = pytest.mark.skipif(maxmin._maxmin is None, reason="the compiled max-min filling is not built")

KEYS = st.one_of(st.integers(-4, 12), st.tuples(st.sampled_from(("cpu", "link")), st.integers(0, 5)))
TIED_WEIGHTS = st.sampled_from((1.0, 1.0, 0.5, 2.0, 0.1, 0.2, 0.3, 0.7, 1.1, 3.0))  # repeats make ties
# no infinite weight: inf x level 0 makes a NaN level, on which the reference's filling never ends
WEIGHTS = st.one_of(TIED_WEIGHTS, st.sampled_from((0.0, -1.0, -0.0)), st.floats(1e-6, 1e6, allow_nan=False))
CAPS = st.one_of(st.sampled_from((1.0, 1.0, 0.9, 0.78, 2.0, 0.0, -0.5, math.inf, 1e-300)),
                 st.floats(1e-3, 1e3, allow_nan=False))


@st.composite
def instances(draw, weights=WEIGHTS, caps=CAPS):
    keys = draw(st.lists(KEYS, min_size=1, max_size=10, unique=True))
    demands = draw(st.lists(st.dictionaries(st.sampled_from(keys), weights, max_size=len(keys)), max_size=14))
    capacity = {k: draw(caps) for k in keys}
    return demands, capacity


def outcome(fn, demands, capacity):
    try:
        return [r.hex() for r in fn(demands, capacity)]
    except ZeroDivisionError:  # a weight cancelled to zero: both raise it
        return "ZeroDivisionError"


def both(demands, capacity):
    return (outcome(maxmin.maxmin_rates_reference, demands, capacity),
            outcome(maxmin.maxmin_rates, demands, capacity))


@compiled
@settings(max_examples=400, deadline=None)
@given(instances())
def test_compiled_filling_is_the_reference_bit_for_bit(case):
    ref, fast = both(*case)
    assert fast == ref


@compiled
@settings(max_examples=200, deadline=None)
@given(instances(weights=TIED_WEIGHTS, caps=st.sampled_from((1.0, 1.0, 2.0, 0.78))))
def test_ties_freeze_in_first_use_order_as_the_reference_does(case):
    ref, fast = both(*case)
    assert fast == ref


@compiled
@settings(max_examples=40, deadline=None)
@given(st.integers(2, 24), st.integers(1, 6), st.sampled_from((1.0, 0.5, 1 / 3)))
def test_symmetric_all_to_all_like_instances(n, links_per_flow, frac):
    """n(n-1) flows over a switch: every flow crosses its sender's up-link and receiver's down-link (and
    shared middle links), all saturating at one level - the all-to-all's many-way tie."""
    demands = [{a: frac, n + b: frac, **{2 * n + (a + b + k) % 3: frac for k in range(links_per_flow - 1)}}
               for a in range(n) for b in range(n) if a != b]
    capacity = {k: 50e9 for d in demands for k in d}
    ref, fast = both(demands, capacity.__getitem__)
    assert fast == ref


@compiled
def test_compiled_filling_returns_none_for_what_it_does_not_cover():
    """A demand that is not a dict, an int weight, a NaN weight: the compiled filling declines (None) and
    maxmin_rates runs the reference (whose NaN handling differs between _usage and _freeze)."""
    args = (maxmin._FACTOR, maxmin._TINY, maxmin._PLAIN_SUM)
    assert maxmin._maxmin.maxmin_rates([{0: 1.0}, ((0, 1.0),)], {0: 1.0}, *args) is None
    assert maxmin._maxmin.maxmin_rates([{0: 1}], {0: 1.0}, *args) is None
    assert maxmin._maxmin.maxmin_rates([{0: math.nan}], {0: 1.0}, *args) is None
    assert maxmin._maxmin.maxmin_rates([{0: 1.0}], {0: 1.0}, *args) == [1.0]
    assert maxmin.maxmin_rates([{0: 1}, {0: 1.0}], {0: 1.0}) == maxmin.maxmin_rates_reference([{0: 1}, {0: 1.0}],
                                                                                              {0: 1.0})


def test_reference_is_what_maxmin_rates_returns_without_the_extension(monkeypatch):
    """Negative control for the dispatch: with the extension hidden, maxmin_rates is the reference."""
    demands, capacity = [{0: 1.0, 1: 0.5}, {1: 1.0}, {}], {0: 1.0, 1: 0.7}
    monkeypatch.setattr(maxmin, "_maxmin", None)
    assert [r.hex() for r in maxmin.maxmin_rates(demands, capacity)] == \
        [r.hex() for r in maxmin.maxmin_rates_reference(demands, capacity)]


ROUTES = st.lists(st.integers(0, 7), max_size=5).map(tuple)  # repeats inside a route included
FRACS = st.one_of(st.sampled_from((1.0, 0.5, 1 / 3, 0.25, 0.0, -1.0)), st.floats(1e-6, 4.0))
PHASE_CAPS = st.lists(st.one_of(st.sampled_from((1.0, 2.0, 50e9, 0.0, math.inf)), st.floats(1e-3, 1e12)),
                      min_size=8, max_size=8)


@st.composite
def phases_(draw):
    """A phase's own and concurrent flows drawn from a few routes and fractions, so identical flows (merged
    with a multiplicity), flows shared between own and concurrent, and equal saturation levels recur."""
    from meshsim.sim.cost.collectives.phases import Flow

    routes = draw(st.lists(ROUTES, min_size=1, max_size=5))
    fracs = draw(st.lists(FRACS, min_size=1, max_size=3))
    flow = st.builds(Flow, st.sampled_from(routes), st.sampled_from(fracs))
    return draw(st.lists(flow, max_size=8)), draw(st.lists(flow, max_size=8)), draw(PHASE_CAPS)


def phase_outcome(fn, own, extra, caps):
    try:
        s_per_byte, busy = fn(own, extra, caps)
    except ZeroDivisionError:
        return "ZeroDivisionError"
    return s_per_byte.hex(), [(li, v.hex()) for li, v in busy.items()]  # values and the dict's order


@compiled
@settings(max_examples=400, deadline=None)
@given(phases_())
def test_compiled_phase_rates_are_the_reference_bit_for_bit(case):
    from meshsim.sim.cost.collectives import phases

    own, extra, caps = case
    assert phase_outcome(phases._phase_rates, own, extra, caps) == \
        phase_outcome(phases._phase_rates_reference, own, extra, caps)


@compiled
def test_compiled_phase_rates_of_an_all_to_all_on_a_fabric():
    """The EP all-to-all's phase (64 ranks on 8 DGX H100 plus a concurrent copy sharing the leaf): thousands
    of distinct routes, one saturation level shared by hundreds of NIC links."""
    from meshsim.sim.cost.collectives import phases
    from meshsim.sim.cost.collectives.cost import build_plan
    from meshsim.topologies.registry import build_topology

    topo = build_topology("dgx-h100", 16)
    own = build_plan(topo, "direct", "all_to_all", range(64)).phases[0].flows
    extra = build_plan(topo, "direct", "all_to_all", range(64, 128)).phases[0].flows
    caps = [lk.bw_gbps * 1e9 * 0.9 for lk in topo.links]
    fast = phase_outcome(phases._phase_rates, own, extra, caps)
    assert fast == phase_outcome(phases._phase_rates_reference, own, extra, caps)
    assert maxmin._maxmin.phase_rates(own, extra, caps, maxmin._FACTOR, maxmin._TINY, maxmin._PLAIN_SUM) is not None


@compiled
@pytest.mark.skipif(not maxmin._PLAIN_SUM, reason="sum() of floats is compensated from Python 3.12")
@settings(max_examples=150, deadline=None)
@given(instances())
def test_the_python_sum_branch_agrees_where_sum_adds_left_to_right(case):
    """The branch Python >= 3.12 takes (each weight through Python's own sum()) is run here too: before 3.12
    sum() adds left to right, so it must give the plain branch's floats."""
    demands, capacity = case
    args = (maxmin._FACTOR, maxmin._TINY)
    try:
        plain = maxmin._maxmin.maxmin_rates(demands, capacity, *args, True)
        python_sum = maxmin._maxmin.maxmin_rates(demands, capacity, *args, False)
    except ZeroDivisionError:
        return
    assert (plain is None and python_sum is None) or [r.hex() for r in plain] == [r.hex() for r in python_sum]
