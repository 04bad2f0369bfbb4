"""The build's shortcuts (issue 40) against their long ways, over generated inputs aimed at their edges.

- stamping.stamp_chain on a StageOps (StageOps.add_chain: one call per chain) against stamp() per link on the
  reference OpList: the same records, stamps, tiling record, and the same error for a block whose input key
  is not the chain's; an input never made (None) drops the record in both.
- tiling's column checks (_all_plain, _int64_column) against the per-value rules they replace (plain,
  int_or_none), at the int32 / int64 bounds, with bools, floats and None.
- Tiling.tiled / work_table / fields (one spread of the stamps over the positions) against the values read
  off the records, after generated builder calls (gated stamps, replaced ops, appended ops).
- StageOps.layer_name (what the parameter gathers read, no record built) against the records.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from results_reference.build_rules import int_or_none, plain
from test_stage_ops import _apply, _templates, calls

from meshsim.sim.schedule.ops import Elementwise, Op, Schedule, arrays_from_ops
from meshsim.sim.schedule.stage_ops import StageOps
from meshsim.sim.schedule.stamping import stamp_chain
from meshsim.sim.schedule.tiling import NONE, OpList, _all_plain, _int64_column
from meshsim.sim.schedule.work_table import WorkTable

EDGES = [0, 1, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, 2**63, NONE, NONE + 1, True, False, 1.0, None]


@st.composite
def chains(draw):
    """Reserved slots, then chains: (links as (template pick, block, layer, key), micro-batch, input pick or None)."""
    link = st.tuples(st.integers(0, 2), st.sampled_from(["L0", "L7", "head", "fp8.c1"]),
                     st.sampled_from([None, 0, 5]), st.sampled_from([None, "in", "gin", "loss"]))
    chain = st.tuples(st.lists(link, min_size=1, max_size=5), st.integers(0, 3),
                      st.one_of(st.none(), st.floats(0, 1, exclude_max=True)))
    return draw(st.integers(0, 2)), draw(st.lists(chain, min_size=1, max_size=6))


def _chain_templates():
    fwd, bwd = _templates()
    from meshsim.sim.schedule.template import Template
    lone = Template()  # no input at all
    lone.marks["out"] = lone.add("fwd", "e", Elementwise("k", 2, 2), ())
    return [fwd, bwd, lone]


def _run_chains(ops, reserved: int, steps, tpls) -> list:
    out = []
    for picks, mb, at in steps:
        links = [(tpls[k], block, layer, key) for k, block, layer, key in picks]
        x = None if at is None else int(at * len(ops))
        try:
            out.append(stamp_chain(ops, links, mb, x))
        except KeyError as err:
            out.append(("KeyError", err.args))
            break  # (a builder does not go on after it)
    return out


@settings(max_examples=200, deadline=None, derandomize=True)
@given(case=chains())
def test_stamp_chain_equals_stamp_per_link(case):
    reserved, steps = case
    tpls = _chain_templates()
    lazy, ref = StageOps(reserved), OpList([None] * reserved)
    got, want = _run_chains(lazy, reserved, steps, tpls), _run_chains(ref, reserved, steps, tpls)
    assert got == want
    assert len(lazy) == len(ref) and list(lazy) == list(ref)
    ta, tb = lazy.tiling, ref.tiling
    assert (ta.broken, ta.dirty, ta.gated, ta.order) == (tb.broken, tb.dirty, tb.gated, tb.order)
    assert list(lazy.frozen()) == list(ref.frozen())


def test_a_chain_breaks_as_the_stamps_do():
    """Negative controls: a block whose input key the chain does not give raises the stamp's KeyError on both;
    a chain fed None drops the tiling record on both."""
    fwd, bwd, lone = _chain_templates()
    for ops in (StageOps(), OpList()):
        with pytest.raises(KeyError, match="in"):
            stamp_chain(ops, [(lone, "L0", 0, None), (fwd, "L1", 1, "loss")], 0, None)
    for ops in (StageOps(), OpList()):
        stamp_chain(ops, [(bwd, "L0", 0, "gin")], 0, None)
        assert ops.tiling.broken and not ops.tiling.order


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values=st.lists(st.sampled_from(EDGES), max_size=6))
def test_int64_column_is_the_per_value_rule(values):
    col = _int64_column(values)
    if all(map(int_or_none, values)):
        assert col is not None and col.dtype == np.int64
        assert col.tolist() == [NONE if v is None else v for v in values]
    else:
        assert col is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=st.lists(st.tuples(st.sampled_from(["compute", "tp_comm", "pp_comm", "nowhere"]),
                               st.sampled_from(EDGES[:-1]), st.sampled_from(EDGES),
                               st.lists(st.sampled_from(EDGES[:-1]), max_size=3)), max_size=5))
def test_all_plain_is_the_per_op_rule(rows):
    ops = [Op(i, f"x{i}", stream, stream, "fwd", Elementwise("k", 1, 1), tuple(deps), None, 0, calls, wait)
           for i, (stream, calls, wait, deps) in enumerate(rows)]
    assert _all_plain(ops) == all(map(plain, ops))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=calls())
def test_spread_columns_equal_the_records(case):
    """tiled arrays, work table and fields from the stamps equal those read off the records, and layer_name
    equals the records' (layer, name), after generated builder calls on a StageOps."""
    reserved, steps = case
    tpls = _templates()
    ops = StageOps(reserved)
    _apply(ops, reserved, steps, tpls)
    for p in range(reserved, len(ops)):
        assert ops.layer_name(p) == (ops[p].layer, ops[p].name)
    if reserved or ops.tiling.broken:  # (reserved slots still None: not a schedule)
        return
    held = ops.frozen()
    s = Schedule(held, 1, 1, 1, tiling=ops.sealed(held))
    records = tuple(held)
    assert s.tiled_arrays is not None and s.tiled_arrays == arrays_from_ops(records)
    w, r = s.work_table, WorkTable.of(records)
    assert w.works == r.works and np.array_equal(w.index, r.index) and np.array_equal(w.first, r.first)
    f = s.fields
    assert [f.phases[c] for c in f.phase.tolist()] == [op.phase for op in records]
    assert f.layer.tolist() == [NONE if op.layer is None else op.layer for op in records]
    assert f.micro_batch.tolist() == [NONE if op.micro_batch is None else op.micro_batch for op in records]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(stamps=st.integers(1, 4), swaps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=6))
def test_work_table_when_replaced_ops_hold_other_works(stamps, swaps):
    """The edge of Tiling.work_table's first positions: ops replaced by records of another work (every stamp's
    copy of a stencil op replaced: its work held by no op), numbered as WorkTable.of numbers them."""
    fwd = _templates()[1]  # (its one input: "gin")
    ops = StageOps()
    for layer in range(stamps):
        ops.add_chain([(fwd, f"L{layer}", layer, "gin")], 0, max(0, len(ops) - 1))
    other = [Elementwise("swap", 1, 1), Elementwise("swap", 2, 2)]
    for stamp_at, op_at in swaps:
        p = min(stamp_at, stamps - 1) * len(fwd.ops) + op_at % len(fwd.ops)
        ops[p] = ops[p]._replace(work=other[op_at % 2])
    held = ops.frozen()
    s = Schedule(held, 1, 1, 1, tiling=ops.sealed(held))
    w, r = s.work_table, WorkTable.of(tuple(held))
    assert w.works == r.works and np.array_equal(w.index, r.index) and np.array_equal(w.first, r.first)
