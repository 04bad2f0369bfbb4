"""The compiled arbiter steps (sim/engine/_core.pyx hot_of_arrays, components_of_arrays) against their numpy
reference (sim/engine/fair_rates.py): generated load sets aimed at the threshold (sums of 1 + 1e-12 +/- an
ulp, loads that cancel, zero and negative-zero loads on hot resources, resources met again after many
others), compared exactly: the hot resources in order, the per-load marks, the components; and the rates
that follow, float.hex for float.hex, against fair_rates on the dicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.sim.engine import fair_rates as fr

pytestmark = pytest.mark.skipif(fr._hot_of is fr.hot_of_arrays,  # noqa: SLF001
                                reason="the compiled core is not built")
_EDGE = 1.0 + 1e-12
WEIGHTS = st.one_of(
    st.sampled_from([0.0, -0.0, 0.25, 1 / 3, 0.5, 0.7, 1.0, 1e-13, _EDGE, math.nextafter(_EDGE, 2.0),
                     math.nextafter(_EDGE, 0.0), _EDGE / 2, math.nextafter(_EDGE / 2, 1.0)]),
    st.floats(min_value=1e-6, max_value=1.2))
RESOURCES = st.one_of(st.integers(0, 11), st.tuples(st.just("cpu"), st.integers(0, 2)))  # links, compute
LOADS = st.lists(st.dictionaries(RESOURCES, WEIGHTS, min_size=0, max_size=6), min_size=2, max_size=9)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LOADS)
def test_compiled_steps_equal_numpy(loads):
    arrays = [fr.load_arrays(load) for load in loads]
    order, touching = fr.hot_of_arrays(arrays)
    assert fr._hot_of(arrays) == (order, touching)  # noqa: SLF001
    numbers = [7 * j + 3 for j in range(len(loads))]
    assert fr._hot_marks(arrays, numbers) == fr.hot_marks_of_arrays(arrays, numbers)  # noqa: SLF001
    if order:
        assert fr._components_of(arrays, order) == fr.components_of_arrays(arrays, order)  # noqa: SLF001
        for numbers in (None, list(range(len(loads)))):
            fr._HOT_RATES.clear()  # noqa: SLF001
            fr._COMPONENT_RATES.clear()  # noqa: SLF001
            got = fr.fair_rates_of_arrays(loads, arrays, numbers)
            assert [r.hex() for r in got] == [r.hex() for r in fr.fair_rates(loads)]


def test_negative_control_the_first_sum_over_the_threshold_is_hot():
    """The threshold is strict and exact: the largest second load whose sum with 0.5 stays at or below
    1 + 1e-12 leaves the resource cold; the next double above it makes it hot, in both versions."""
    edge = 1.0 + 1e-12
    w = edge - 0.5
    while 0.5 + w <= edge:
        w = math.nextafter(w, 1.0)
    below = math.nextafter(w, 0.0)
    assert 0.5 + below <= edge < 0.5 + w
    base = fr.load_arrays({900: 0.5})
    cold, hot_load = fr.load_arrays({900: below}), fr.load_arrays({900: w})
    assert fr._hot_of([base, cold]) == fr.hot_of_arrays([base, cold]) == ([], [])  # noqa: SLF001
    hot = fr._RESOURCE_INDEX[900]  # noqa: SLF001
    assert fr._hot_of([base, hot_load]) == fr.hot_of_arrays([base, hot_load]) == ([hot], [True, True])  # noqa: SLF001


def test_resources_beyond_the_scratch_are_met():
    """Resource indices far past any met before grow the compiled scratch (and reset it between calls)."""
    loads = [{("far", k): 0.6 for k in range(3000)}, {("far", 2999): 0.6, ("far", 0): 0.6}]
    arrays = [fr.load_arrays(load) for load in loads]
    for _ in range(2):
        assert fr._hot_of(arrays) == fr.hot_of_arrays(arrays)  # noqa: SLF001
    assert np.asarray(fr._hot_of(arrays)[0]).size == 2  # noqa: SLF001
