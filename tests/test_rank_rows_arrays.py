"""RankOpRows over stages whose op ids are int64 arrays (rows_by_event's as_array columns): the same
mapping as the dict the long way, item for item and lookup by lookup (ints found by bisection, absent ints
between, before and after the ids, ints beyond 64 bits, equal keys of other types: 3.0, True), iterated
as ints; a stage whose array is not increasing is read through its dict, as before."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from results_reference.rank_rows import ROWS, rows_from_stage_maps

from meshsim.sim.results import step_result as sr

_stage = st.lists(st.tuples(st.integers(-5, 60), st.sampled_from(ROWS)), max_size=8)
_probe = st.one_of(st.tuples(st.integers(-1, 9), st.integers(-8, 70)), st.just((0, 2**64)), st.just((0, -2**70)),
                   st.just((0, 3.0)), st.just((0, True)), st.just((1, np.int64(4))), st.just("ab"))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(stages=st.lists(_stage, min_size=1, max_size=3), ranks=st.lists(st.integers(0, 8), max_size=8),
       stage_size=st.integers(1, 3), increasing=st.booleans(), probes=st.lists(_probe, max_size=10))
def test_array_ids_are_the_dict(stages, ranks, stage_size, increasing, probes):
    if increasing:
        stages = [sorted(dict(s).items()) for s in stages]
    per_stage = [dict(s) for s in stages]
    sources = [lambda s=s: (np.array([i for i, _ in s], dtype=np.int64), [r for _, r in s]) for s in stages]
    fast = sr.RankOpRows(sources, ranks, stage_size)
    want = rows_from_stage_maps(per_stage, ranks, stage_size)
    for key in [*want, *probes]:
        assert fast.get(key, "none") is want.get(key, "none")
        assert (key in fast) == (key in want)
    assert list(fast.items()) == list(want.items()) and len(fast) == len(want)
    assert all(type(op) is int for _, op in fast)
    arrays = fast.key_arrays()
    if arrays is not None:
        rank, op, rows = arrays
        assert list(zip(rank.tolist(), op.tolist(), strict=True)) == list(want) and rows == list(want.values())


def test_a_tiled_schedule_gives_increasing_int64_ids_and_the_same_rows():
    from meshsim.scenarios.load import load_and_resolve
    from meshsim.sim.results.costers import CollectiveCoster
    from meshsim.sim.schedule.pipeline_builder import build_stage_schedules

    rs = load_and_resolve("llama2-70b-h100-pp4")
    coster = CollectiveCoster(rs)
    seen = 0
    for s in build_stage_schedules(rs):
        rows = list(coster.chosen(s, s.stage * rs.stage_size))
        ids, got = sr.op_collective_columns(s, rows, as_array=True)
        want_ids, want = sr.op_collective_columns(s, rows)
        if s.tiled_arrays is not None:
            assert isinstance(ids, np.ndarray) and ids.dtype == np.int64 and bool((np.diff(ids) > 0).all())
        assert list(map(int, ids)) == want_ids and got == want
        seen += len(want)
    assert seen  # the stages run collectives: the comparison is not vacuous
