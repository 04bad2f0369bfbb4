"""costers.count_collectives_between(schedule, lo, hi), the steady state's per-period collective count over
the schedule's WorkTable, equals counting the ops lo..hi-1 one by one (count_collectives_per_op), on the
schedules of generated scenarios (test_schedule_arrays.scenarios: every builder path, stamped or not) at
slices that start and end on the edges: empty, one op, the whole schedule, and arbitrary cuts."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schedule_arrays import resolved_case, scenarios
from test_steady_state import resolved

from meshsim.sim.results.costers import count_collectives_between, count_collectives_per_op
from meshsim.sim.results.simulate import build_stage_schedules


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), cuts=st.lists(st.floats(0, 1), min_size=2, max_size=2))
def test_counts_between_equal_counting_op_by_op(case, cuts):
    rs = resolved_case(case)
    for s in build_stage_schedules(rs):
        n = len(s.ops)
        lo, hi = sorted(int(c * n) for c in cuts)
        for a, b in ((lo, hi), (0, n), (0, 0), (n, n), (0, min(1, n)), (max(0, n - 1), n)):
            assert count_collectives_between(s, a, b) == count_collectives_per_op(s.ops[a:b])
        assert count_collectives_between(s, 0, n)  # not vacuous: every generated step has collectives


def test_a_wrong_slice_is_seen():
    """Negative control: counting one op fewer differs where the last op is a collective."""
    s = build_stage_schedules(resolved("tiny-2gpu", {}, None))[0]
    last = max(i for i in range(len(s.ops)) if count_collectives_per_op(s.ops[i:i + 1]))
    assert count_collectives_between(s, 0, last) != count_collectives_per_op(s.ops[0:last + 1])
