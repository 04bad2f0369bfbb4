"""rows_by_event's RankOpRows (sim/results/step_result.py) against the dict the long way (rows_by_event_dict):
the same items in the same order, the same lookups (present, absent, ranks of no stage, keys of other types
and shapes, equal keys of other types), and key_arrays the columns of its keys; over generated stages,
ranks (repeats, ranks past the last stage) and op ids (ints beyond 64 bits, non-int ids: no key columns);
and on library scenarios, the result's mapping is the long way's dict, and trace.json's collective args read
off its key columns are the Python writer's (tests/test_trace_rows.py writes both ways)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from results_reference.rank_rows import ROWS, rows_by_event_dict, rows_from_stage_maps

from meshsim.sim.results import step_result as sr

_op_id = st.one_of(st.integers(0, 40), st.just(2**64), st.just(3.0))


def _columns(d: dict):
    return lambda: (list(d), list(d.values()))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(per_stage=st.lists(st.dictionaries(_op_id, st.sampled_from(ROWS), max_size=6), min_size=1, max_size=3),
       ranks=st.lists(st.integers(0, 12), max_size=10), stage_size=st.integers(1, 4),
       probes=st.lists(st.one_of(st.tuples(st.integers(-1, 14), _op_id), st.just((1.0, 2)), st.just((True, 1)),
                                 st.just((1, 2, 3)), st.just(7), st.just("ab")), max_size=8))
def test_rank_rows_are_the_dict(per_stage, ranks, stage_size, probes):
    fast = sr.RankOpRows([_columns(d) for d in per_stage], ranks, stage_size)
    want = rows_from_stage_maps(per_stage, ranks, stage_size)
    assert list(fast.items()) == list(want.items()) and len(fast) == len(want) and fast == want
    for key in [*want, *probes]:
        assert fast.get(key, "none") is want.get(key, "none")
        assert (key in fast) == (key in want)
    arrays = fast.key_arrays()
    used = {sr._stage_of(r, stage_size, len(per_stage)) for r in ranks}
    ints = all(type(i) is int and i < 2**63 for s in used for i in per_stage[s])
    if not ints:
        assert arrays is None
        return
    rank, op, rows = arrays
    assert rank.dtype == op.dtype == np.int64
    assert list(zip(rank.tolist(), op.tolist(), strict=True)) == list(want) and rows == list(want.values())


def test_a_repeated_op_id_is_one_item_with_its_last_row():
    fast = sr.RankOpRows([lambda: ([4, 2, 4], [ROWS[0], ROWS[1], ROWS[1]])], [5, 3, 5], 1)
    assert list(fast.items()) == [((5, 4), ROWS[1]), ((5, 2), ROWS[1]), ((3, 4), ROWS[1]), ((3, 2), ROWS[1])]
    assert fast.key_arrays() is None  # its columns would repeat the key


def test_stages_are_read_when_first_needed():
    calls = []
    fast = sr.RankOpRows([lambda: calls.append(0) or ([1], [ROWS[0]]), lambda: calls.append(1) or ([2], [ROWS[1]])],
                         [0, 1, 2, 3], 2)
    assert calls == []
    assert fast[(2, 2)] is ROWS[1] and calls == [1]
    assert fast.key_arrays() is not None and list(fast) == [(0, 1), (1, 1), (2, 2), (3, 2)] and calls == [1, 0]


def test_unhashable_keys_fail_as_in_a_dict():
    fast = sr.RankOpRows([_columns({0: ROWS[0]})], [0], 1)
    with pytest.raises(TypeError):
        fast.get([0, 0])
    with pytest.raises(TypeError):
        {}.get([0, 0])


@pytest.mark.parametrize("name", ["llama2-70b-h100-pp4", "default"])
def test_library_results_hold_the_long_ways_map(name):
    from meshsim.scenarios.library import DEFAULT_SCENARIO
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.results import simulate as sim

    rs = load_and_resolve(DEFAULT_SCENARIO if name == "default" else name)
    seen = {}
    real = sim.rows_by_event

    def spy(schedules, collectives, ranks, stage_size):
        seen["want"] = rows_by_event_dict(schedules, collectives, ranks, stage_size)
        return real(schedules, collectives, ranks, stage_size)

    sim.rows_by_event = spy
    try:
        result = sim.simulate(rs)
    finally:
        sim.rows_by_event = real
    assert isinstance(result.op_collectives, sr.RankOpRows)
    assert list(result.op_collectives.items()) == list(seen["want"].items()) and seen["want"]
