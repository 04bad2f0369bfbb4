"""The compiled trace writer's number texts (sim/outputs/_trace.pyx) against Python's repr: floats through the
whole-number shortcut (an integral |v| < 2**53 written as its int and ".0") and through PyOS_double_to_string,
ints through the two-digits-at-a-time loop; over generated values and the shortcut's edges (+-2**53 and its
neighbours, powers of ten up to 1e16, -0.0, the smallest and largest ints of 64 bits, every width of digits)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshsim.sim.outputs import trace_rows

pytestmark = pytest.mark.skipif(not trace_rows.AVAILABLE, reason="the compiled trace writer is not built")

EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 9.0, 10.0, 99.0, 100.0, 38654705664.0, 2.0**52, 2.0**52 + 1, 2.0**53 - 1,
               2.0**53, 2.0**53 + 2, -(2.0**53 - 1), -(2.0**53), 1e15, 1e15 + 1, 9999999999999998.0, 1e16, 1e17,
               -1e16, 1e-7, 5e-324, 1.7976931348623157e308, 123456789.5, -123456789.0]
EDGE_INTS = [0, 1, -1, 9, 10, -10, 99, 100, -100, 999, 1000, 2**31, 2**53, 2**63 - 1, -(2**63), -(2**63) + 1]


def _text(v: float) -> str:
    return trace_rows._trace.float_text(v)


@pytest.mark.parametrize("v", EDGE_FLOATS + [math.nextafter(2.0**53, 0), math.nextafter(1e16, 0)])
def test_edge_floats_print_as_repr(v):
    assert _text(v) == repr(v)


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(v=st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                   st.integers(-(2**54), 2**54).map(float), st.integers(-(10**17), 10**17).map(float)))
def test_floats_print_as_repr(v):
    assert _text(v) == repr(v)


@pytest.mark.parametrize("k", EDGE_INTS + [10**n for n in range(19)] + [10**n - 1 for n in range(1, 19)])
def test_edge_ints_print_as_repr(k):
    assert trace_rows._trace.int_text(k) == repr(k) == trace_rows._trace.int_text(k)
    if k > 0:
        assert trace_rows._trace.int_text(-k) == repr(-k)


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(k=st.integers(-(2**63), 2**63 - 1))
def test_ints_print_as_repr(k):
    assert trace_rows._trace.int_text(k) == repr(k)
