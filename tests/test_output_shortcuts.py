"""Shortcuts the trace and timeline writers take over a schedule's stamps and an event log's arrays equal the long
way they replace:

- StampedOps.codes (a field's codes numbered per stencil or per stamp and tiled, sim/schedule/stamped_ops.py)
  equals coding the field's column value by value (row_fields._column_codes' long way), on generated
  schedules of every builder path held as stamps, with a shared index carried across stages; and where
  equal values of different types meet (1 and True), the code goes to the value that occurs first;
- RowsContext.hops (the critical path's lane changes found on the columns, no event built: the lane and start
  of each hop's ends, sim/outputs/trace_rows.py) equals trace_slices.hops over the dict of every critical
  event, on generated
  logs (repeated (rank, op id) rows, several streams and ranks) and paths that name ops by equal keys of
  other types (1.0 for 1).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_schedule_arrays import resolved_case, scenarios
from test_steady_state import resolved
from test_trace_rows import logs

from meshsim.sim.engine.event_rows import EventRows
from meshsim.sim.outputs import trace_rows
from meshsim.sim.outputs.trace_slices import hops
from meshsim.sim.results.critical_path import Segment
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.stamped_ops import CODED_FIELDS, StampedOps


def _column_codes(ops, field: str, index: dict) -> np.ndarray:
    """The long way: the column, its distinct values in first-seen order appended to `index`, each op's code."""
    values = ops.column(field)
    for value in dict.fromkeys(values):
        index.setdefault(value, len(index))
    return np.fromiter(map(index.__getitem__, values), np.intc, len(values))


@pytest.mark.usefixtures("stamped_always")
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_stamp_codes_equal_the_column_codes(case):
    rs = resolved_case(case)
    stages = [s.ops for s in build_stage_schedules(rs)]
    assert all(isinstance(ops, StampedOps) for ops in stages)
    for field in CODED_FIELDS:
        fast, slow = {}, {}
        for ops in stages:  # one index across the stages, as row_fields.op_codes carries it
            got, want = ops.codes(field, fast), _column_codes(ops, field, slow)
            assert got.dtype == want.dtype and np.array_equal(got, want), field
        assert list(fast.items()) == list(slow.items()) and [type(k) for k in fast] == [type(k) for k in slow]


@pytest.mark.usefixtures("stamped_always")
def test_equal_values_of_other_types_code_to_the_first():
    """A loose op whose micro-batch is True before stamps of micro-batch 1: True keeps the code (as dict.fromkeys
    keeps the first key), and a lying first-value rule would show as a key of another type."""
    ops = build_stage_schedules(resolved("llama2-70b-h100-pp4", {}, 8))[0].ops
    first_loose = min(p for p in ops._loose if ops._loose[p].micro_batch == 1)
    loose = dict(ops._loose)
    loose[first_loose] = loose[first_loose]._replace(micro_batch=True)
    odd = StampedOps(ops._order, len(ops), loose)
    fast, slow = {}, {}
    assert np.array_equal(odd.codes("micro_batch", fast), _column_codes(odd, "micro_batch", slow))
    assert list(fast.items()) == list(slow.items()) and [type(k) for k in fast] == [type(k) for k in slow]
    assert any(k is True for k in fast)


@pytest.mark.skipif(not trace_rows.AVAILABLE or EventRows is None, reason="the compiled writer or rows is not built")
@settings(max_examples=150, deadline=None)
@given(log=logs(), data=st.data())
def test_row_hops_equal_the_hops_over_every_critical_event(log, data):
    events, path, result = log
    if path and data.draw(st.booleans()):  # a segment naming its op by an equal key of other types
        s = path[data.draw(st.integers(0, len(path) - 1))]
        if s.op_id is not None:
            path = [*path, Segment("y", "compute", float(s.rank), 0.0, 1.0, op_id=float(s.op_id)), *path]
    ctx = trace_rows.RowsContext(events, path, result)
    want = [((a.rank, a.stream, a.start_s), (b.rank, b.stream, b.start_s))
            for a, b in hops(path, ctx.critical_events(events))]
    got = ctx.hops(events, path)
    assert [(tuple(a), tuple(b)) for a, b in got] == want
    assert all(type(x) is type(y) for pair in zip(got, want, strict=True) for a, b in zip(*pair, strict=True)
               for x, y in zip(a, b, strict=True))


@pytest.mark.usefixtures("stamped_always")
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_name_parts_join_to_the_names(case):
    """StampedOps.name_parts: prefix + suffix is the op's name, for every op (stamped, loose, replaced)."""
    rs = resolved_case(case)
    stamped = [s for s in build_stage_schedules(rs) if isinstance(s.ops, StampedOps)]
    assume(stamped)  # the combined EP-overlap schedules stamp op by op: their stages hold records
    for s in stamped:
        prefixes, suffixes = s.ops.name_parts()
        assert list(map(str.__add__, prefixes, suffixes)) == s.ops.column("name") == [op.name for op in s.ops]


@pytest.mark.skipif(not trace_rows.AVAILABLE or EventRows is None, reason="the compiled writer or rows is not built")
@pytest.mark.usefixtures("stamped_always")
@pytest.mark.parametrize("mark", ["", 'é"\\\n\x7f'])
def test_a_trace_of_stamped_ops_is_the_python_trace(tmp_path, monkeypatch, mark):
    """The compiled writer over stages held as stamps (names written as prefix then suffix) writes the Python
    writer's bytes; with prefixes that need JSON escapes too (each part escaped alone)."""
    from test_trace_rows import both

    from meshsim.sim.results import simulate

    result, log, _ = simulate.simulate_with_events(resolved("llama2-70b-h100-pp4", {}, 8))
    ev = log.events
    assert all(isinstance(ops, StampedOps) for ops in ev.ops)
    stages = [StampedOps([(*stamp[:5], mark + stamp[5]) for stamp in ops._order], len(ops), ops._loose)
              for ops in ev.ops]
    events = EventRows(ev.columns, ev.stage_arr, ev.op_index_arr, stages, ev.sizes, ev.event_type)
    fast, slow, python_runs = both(tmp_path, events, result.critical_path, monkeypatch, result=result)
    assert fast == slow and python_runs == 0
    assert (b'\\u00e9\\"\\\\\\n\\u007f' in fast) == bool(mark)
