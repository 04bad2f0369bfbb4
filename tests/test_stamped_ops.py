"""A built schedule's ops held as stamps (sim/schedule/stamped_ops.py) equal the records the builder stamped,
on generated schedules of every builder path (test_schedule_arrays.scenarios): the reference is the same
build on the records-building op list (stage_ops.LAZY off: tiling.OpList) with OpList.frozen returning the
records themselves (what a Schedule held before). Compared: every
op by index (negative ones too), iteration, slices of any start / stop / step, reversed, each field's
column, equality and hash both ways, pickling; the engine's run and the results over either are equal.
Negative control: a stamp record that lies (another prefix) gives other records, which the comparison sees."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_schedule_arrays import scenarios
from test_steady_state import resolved

from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule import stage_ops, stamped_ops
from meshsim.sim.schedule.ops import OP_FIELDS
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.stamped_ops import StampedOps, op_column
from meshsim.sim.schedule.tiling import OpList

pytestmark = pytest.mark.usefixtures("stamped_always")  # small schedules held as stamps too


def _built(name, over, micro_batches, monkeypatch):
    """(schedules holding StampedOps, the same build holding the stamped records)."""
    try:
        rs = resolved(name, over, micro_batches)
    except UserError:
        assume(False)
    lazy = build_stage_schedules(rs)
    with monkeypatch.context() as m:
        _records_held(m)
        records = build_stage_schedules(rs)
    return lazy, records


def _records_held(m) -> None:
    """Builders stamp into tiling.OpList (every record built) and the schedule holds the records."""
    m.setattr(stage_ops, "LAZY", False)
    m.setattr(OpList, "frozen", lambda self: tuple(self))


def _same_ops(ops: StampedOps, ref: tuple, draw_slices) -> None:
    n = len(ref)
    assert len(ops) == n and tuple(ops) == ref and list(ops) == list(ref)
    assert [ops[i] for i in range(n)] == list(ref) and [ops[-i] for i in range(1, n + 1)] == [ref[-i] for i in
                                                                                               range(1, n + 1)]
    for lo, hi, step in draw_slices:
        assert ops[lo:hi:step] == ref[lo:hi:step]
        assert ops[lo:hi] == ref[lo:hi]
    assert list(reversed(ops)) == list(reversed(ref))
    for field in OP_FIELDS:
        assert ops.column(field) == [getattr(op, field) for op in ref], field
        assert op_column(ops, field) == op_column(ref, field)
    assert ops == ref and ref == ops and (ops != ref) is False and hash(ops) == hash(ref)
    assert pickle.loads(pickle.dumps(ops)) == ref
    with pytest.raises(IndexError):
        ops[n]


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), data=st.data())
def test_stamped_ops_equal_the_records(case, data, monkeypatch):
    lazy, records = _built(*case, monkeypatch)
    for s, ref in zip(lazy, records, strict=True):
        assert isinstance(s.ops, StampedOps) and type(ref.ops) is tuple
        n = len(ref.ops)
        bound = st.integers(-n - 3, n + 3)
        slices = data.draw(st.lists(st.tuples(bound, bound, st.sampled_from([1, 1, 2, 3, -1, -2])), max_size=6))
        _same_ops(s.ops, ref.ops, slices)
        assert s == ref
        assert s.tiled_arrays == ref.tiled_arrays


def test_the_block_cache_is_bounded_and_reads_stay_equal(monkeypatch):
    monkeypatch.setattr(stamped_ops, "CACHED_BLOCKS", 3)
    lazy, records = _built("llama2-70b-h100-pp4", {}, 8, monkeypatch)
    ops, ref = lazy[0].ops, records[0].ops
    order = [*range(0, len(ref), 7), *range(len(ref) - 1, -1, -5)]
    assert [ops[i] for i in order] == [ref[i] for i in order]
    assert len(ops._cache) <= 3


def test_a_lying_stamp_record_is_seen():
    """Negative control: a stamp recorded with another prefix builds other names."""
    s = build_stage_schedules(resolved("tiny-2gpu"))[0]
    ops = s.ops
    base, stencil, ext, layer, mb, prefix = ops._order[3]
    lying = StampedOps([*ops._order[:3], (base, stencil, ext, layer, mb, "X" + prefix), *ops._order[4:]], len(ops),
                       ops._loose)
    assert lying != ops and lying[base].name == "X" + ops[base].name
    assert lying.column("name") != ops.column("name")


def test_a_run_over_stamped_ops_equals_the_run_over_records(monkeypatch):
    """The engine, critical path and breakdown over StampedOps equal those over the records."""
    from meshsim.sim.results import simulate

    rs = resolved("llama2-70b-h100-pp4", {}, 8)
    runs = []
    for held_as_records in (False, True):
        with monkeypatch.context() as m:
            if held_as_records:
                _records_held(m)
            result, log, _ = simulate.simulate_with_events(rs)
        runs.append((result, tuple(log.events)))
    assert runs[0][1] == runs[1][1]
    assert replace(runs[0][0], events=()) == replace(runs[1][0], events=())


def test_op_field_codes_over_stamped_ops_equal_those_over_records(monkeypatch):
    """The trace and timeline writers' per-row op-field codes (sim/outputs/row_fields.op_codes) read off
    StampedOps' columns equal those _trace.op_codes reads off the records."""
    from meshsim.sim.outputs.row_fields import op_codes
    from meshsim.sim.results import simulate

    rs = resolved("llama2-70b-h100-pp4", {}, 8)
    logs = []
    for held_as_records in (False, True):
        with monkeypatch.context() as m:
            if held_as_records:
                _records_held(m)
            logs.append(simulate.simulate_with_events(rs)[1])
    assert isinstance(logs[0].events.ops[0], StampedOps) and type(logs[1].events.ops[0]) is tuple
    for field in ("stream", "category", "phase", "layer", "micro_batch", "name", "id"):
        (a, va), (b, vb) = op_codes(logs[0].events, field), op_codes(logs[1].events, field)
        assert va == vb and a.dtype == b.dtype and (a == b).all(), field
