"""The engine's input check, per-stream views, host syncs and the work table read off a built schedule's tiled
record (sim/schedule/tiling.py) equal the long way, op by op, on generated schedules of every builder path
(test_schedule_arrays.scenarios); the same schedule with its record dropped (`replace(s, tiling=None)`)
takes the long way. Negative controls: an op the columns cannot hold (unknown stream, negative host wait,
a dep past the int range) drops the tiled arrays; an invalid value they can hold (negative host calls, a
wait on a later op, a dep out of range) is refused by the column check with the per-op check's message."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_schedule_arrays import resolved_case, scenarios
from test_steady_state import resolved

from meshsim.sim.cost.host_dispatch import issue_times_s
from meshsim.sim.engine import events
from meshsim.sim.engine.host import host_syncs, schedule_syncs
from meshsim.sim.engine.processes import OpsAt
from meshsim.sim.results.period_keys import key_index, regular_mask
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.tiling import NONE, OpList
from meshsim.sim.schedule.work_table import WorkTable

pytestmark = pytest.mark.usefixtures("stamped_always")  # small schedules held as stamps too


def _pairs(case):
    rs = resolved_case(case)
    return [(s, replace(s, tiling=None)) for s in build_stage_schedules(rs)]


def _same_table(a: WorkTable, b: WorkTable) -> None:
    assert len(a.works) == len(b.works) and all(map(lambda x, y: x is y, a.works, b.works))
    for x, y in ((a.index, b.index), (a.first, b.first)):
        assert x.dtype == y.dtype and np.array_equal(x, y)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_array_reads_equal_the_long_way(case):
    for s, long in _pairs(case):
        assert s.tiled_arrays is not None and long.tiled_arrays is None
        tiled_table = s.tiling.work_table(s.ops)
        assert tiled_table is not None
        _same_table(tiled_table, WorkTable.of(s.ops))
        _same_table(s.work_table, long.work_table)
        assert events._valid_arrays(s.tiled_arrays) and events._valid_ops(long.ops)
        fast, slow = events._by_stream(s), events._by_stream(long)
        assert list(fast) == list(slow)
        for k, view in fast.items():
            assert isinstance(view, OpsAt) and len(view) == len(slow[k])
            assert list(view) == list(slow[k]) and list(view[1:3]) == list(slow[k][1:3])
        for dispatch_s in (20e-6, 1.0):
            times = issue_times_s(s, dispatch_s)
            assert schedule_syncs(s, times) == host_syncs(long.ops, times) == schedule_syncs(long, times)
            assert schedule_syncs(s, ()) is None
        _same_fields(s)
        _same_keys_and_masks(s, long)
        ranks = [0]
        a, b = events.check_inputs(s, ranks), events.check_inputs(long, ranks)
        assert [{k: list(v) for k, v in x.items()} for x in a.per_stream] == \
            [{k: list(v) for k, v in x.items()} for x in b.per_stream]


def _same_fields(s) -> None:
    f = s.fields
    assert f is not None
    assert [f.phases[k] for k in f.phase.tolist()] == [op.phase for op in s.ops]
    for column, name in ((f.layer, "layer"), (f.micro_batch, "micro_batch")):
        assert [None if v == NONE else v for v in column.tolist()] == [getattr(op, name) for op in s.ops]


def _same_keys_and_masks(s, long) -> None:
    fast, slow = key_index(s), key_index(long)
    assert fast.mbs == slow.mbs and fast.parts == slow.parts
    assert np.array_equal(fast.none, slow.none) and np.array_equal(fast.code, slow.code)
    per_mb = max(1, len(s.ops) // max(1, s.micro_batches))
    for unit in (1, 2):
        for p in (0, 1, per_mb // 2, per_mb, 2 * per_mb, len(s.ops) - 1):
            got = regular_mask(s.ops, fast, p, unit, tiled=s.tiled_arrays, fields=s.fields, table=s.work_table)
            want = regular_mask(long.ops, slow, p, unit)
            assert got.dtype == want.dtype and np.array_equal(got, want)


def _tiny():
    s = build_stage_schedules(resolved("tiny-2gpu"))[0]
    assert s.tiled_arrays is not None
    return s


def _with(s, position: int, **changes):
    """`s` with op `position` replaced (`changes`), its record kept: the op is read off its record (loose)."""
    ops = OpList(s.ops)
    ops[position] = ops[position]._replace(**changes)
    bad = tuple(ops)
    return replace(s, ops=bad, tiling=ops.sealed(bad))


@pytest.mark.parametrize(("changes", "message"), [
    ({"host_calls": -1}, "host calls"),
    ({"host_wait": 7}, "not an earlier op"),
    ({"host_wait": 5}, "not an earlier op"),
    ({"deps": (-3,)}, "unknown op ids"),
])
def test_the_column_check_refuses_what_the_op_check_refuses(changes, message):
    sched = _with(_tiny(), 5, **changes)
    assert sched.tiled_arrays is not None  # held by the columns ...
    assert not events._valid_arrays(sched.tiled_arrays) and not events._valid_ops(sched.ops)  # ... and refused
    with pytest.raises(ValueError, match=message):
        events.check_inputs(sched, [0, 1])


@pytest.mark.parametrize(("changes", "message"), [
    ({"stream": "nvlink"}, "unknown stream"),
    ({"host_wait": -1}, "not an earlier op"),
    ({"deps": (2**40,)}, "unknown op ids"),
    ({"host_calls": 2.0}, None),
])
def test_ops_the_columns_cannot_hold_take_the_long_way(changes, message):
    sched = _with(_tiny(), 5, **changes)
    assert sched.tiled_arrays is None and sched.tiling.work_table(sched.ops) is not None
    if message is None:
        events.check_inputs(sched, [0, 1])  # a float host call count is valid, read off the op
        return
    with pytest.raises(ValueError, match=message):
        events.check_inputs(sched, [0, 1])


def test_the_tiled_work_table_reads_a_replaced_ops_work():
    """A negative control for the table: an op replaced with another work is numbered by its own work."""
    s = _tiny()
    other = replace(s.ops[5].work) if hasattr(s.ops[5].work, "__dataclass_fields__") else None
    assert other is not None and other is not s.ops[5].work
    sched = _with(s, 5, work=other)
    table = sched.work_table
    assert table.works[table.index[5]] is other
    _same_table(table, WorkTable.of(sched.ops))
    assert not np.array_equal(table.index, s.work_table.index)


@pytest.mark.parametrize("changes", [{"phase": "bwd"}, {"layer": 99}, {"micro_batch": None}, {"layer": None}])
def test_the_field_columns_read_a_replaced_op(changes):
    """Negative control: a replaced op's own phase / layer / micro-batch is in the columns, and a regular
    mask over the columns still equals the one over the ops."""
    s = _tiny()
    sched = _with(s, 5, **changes)
    _same_fields(sched)
    long = replace(sched, tiling=None)
    _same_keys_and_masks(sched, long)
    (name, value), = changes.items()
    column = sched.fields.phases[sched.fields.phase[5]] if name == "phase" else getattr(sched.fields, name)[5]
    assert column == (NONE if value is None else value)


@pytest.mark.parametrize("changes", [{"phase": 3}, {"layer": 2**70}, {"micro_batch": True}])
def test_field_values_the_columns_cannot_hold_drop_them(changes):
    assert _with(_tiny(), 5, **changes).fields is None
