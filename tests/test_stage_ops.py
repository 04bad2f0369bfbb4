"""Builders stamping into StageOps (no record per stamped op, sim/schedule/stage_ops.py) build the same schedules
as the reference, tiling.OpList, which builds every record as it stamps (stage_ops.LAZY off).

Compared per stage, over generated scenarios of every builder path (test_schedule_arrays.scenarios: dense,
FSDP, 1F1B and interleaved pipelines with and without P2P overlap and scatter-gather, MoE with and without the
combined EP-overlap plans, CP, FP8 recipes, MLA + MTP, the distributed optimizer's overlapped parameter
gathers, recompute), at a STAMPED_MIN_OPS drawn at the stages' own sizes (a stage just under and just over it):
what the schedule holds (a tuple of records or a StampedOps: its stamps and loose records), every record,
the Schedule, the tiling record (stamps, gated stamps, replaced positions), the tiled arrays, work table and
op fields. Then StageOps itself against an OpList after the same generated calls (stamps with and without a
gate or an input, appends, replacements by position, reserved slots): every read the builders make. Negative
control: a StageOps whose deps_of reads wrong (no external inputs) builds other schedules, and the
comparison sees it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schedule_arrays import resolved_case, scenarios
from test_steady_state import resolved

from meshsim.sim.schedule import stage_ops, tiling
from meshsim.sim.schedule.ops import Collective, Elementwise, Gemm, Op
from meshsim.sim.schedule.param_gather import _first_forward_use, _owner
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.stage_ops import StageOps
from meshsim.sim.schedule.stamped_ops import StampedOps
from meshsim.sim.schedule.stamping import stamp
from meshsim.sim.schedule.template import Template
from meshsim.sim.schedule.tiling import OpList

NEVER = 10**9  # a STAMPED_MIN_OPS no stage reaches: every stage holds records


def _build(rs, lazy: bool, min_ops: int, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(stage_ops, "LAZY", lazy)
        m.setattr(tiling, "STAMPED_MIN_OPS", min_ops)
        return build_stage_schedules(rs)


def _stamps(order) -> list[tuple]:
    """A stamp list by value (a Stencil compares by identity; its template ops by value)."""
    return [(base, tuple(s.ops), *rest) for base, s, *rest in order]


def _same_build(lazy, ref) -> None:
    for a, b in zip(lazy, ref, strict=True):
        assert type(a.ops) is type(b.ops)
        assert tuple(a.ops) == tuple(b.ops)
        assert a == b and a.meta == b.meta
        if isinstance(a.ops, StampedOps):
            assert _stamps(a.ops._order) == _stamps(b.ops._order) and len(a.ops) == len(b.ops)
            assert list(a.ops._loose.items()) == list(b.ops._loose.items())
        ta, tb = a.tiling, b.tiling
        assert (ta.broken, ta.dirty) == (tb.broken, tb.dirty)
        assert _stamps(ta.order) == _stamps(tb.order)
        assert [(base, tuple(s.ops)) for base, s in ta.gated] == [(base, tuple(s.ops)) for base, s in tb.gated]
        assert a.tiled_arrays == b.tiled_arrays and a.arrays == b.arrays
        wa, wb = a.work_table, b.work_table
        assert wa.works == wb.works and np.array_equal(wa.index, wb.index) and np.array_equal(wa.first, wb.first)
        fa, fb = a.fields, b.fields
        assert (fa is None) == (fb is None)
        if fa is not None:
            assert fa.phases == fb.phases and all(np.array_equal(getattr(fa, k), getattr(fb, k))
                                                  for k in ("phase", "layer", "micro_batch"))


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios(), data=st.data())
def test_the_lazy_build_equals_the_record_build(case, data, monkeypatch):
    rs = resolved_case(case)
    sizes = [len(s.ops) for s in _build(rs, False, NEVER, monkeypatch)]
    n = data.draw(st.sampled_from(sizes))
    min_ops = data.draw(st.sampled_from([0, n, n + 1, NEVER]))  # the edge: a stage of exactly n ops either side
    lazy, ref = _build(rs, True, min_ops, monkeypatch), _build(rs, False, min_ops, monkeypatch)
    covered = [bool(s.tiling.order) and not s.tiling.broken for s in lazy]  # (combined EP plans: no stamps)
    assert [isinstance(s.ops, StampedOps) for s in lazy] == [n >= min_ops and c for n, c in zip(sizes, covered,
                                                                                              strict=True)]
    _same_build(lazy, ref)


def test_the_405b_stages_equal_the_record_build(monkeypatch):
    """The library's 405B layout (interleaved PP 8 x VP 8, CP 2, FP8 delayed, overlapped parameter gathers)
    cut to one pipeline period's micro-batches: its stages held as stamps, equal to the record build."""
    rs = resolved("llama31-405b-h100-tp8-pp8-cp2", {}, 16)
    lazy, ref = _build(rs, True, 0, monkeypatch), _build(rs, False, 0, monkeypatch)
    assert all(isinstance(s.ops, StampedOps) for s in lazy)
    _same_build(lazy, ref)


def test_a_wrong_deps_read_is_seen(monkeypatch):
    """Negative control: StageOps.deps_of without the external inputs makes the blocking pipeline's gates add
    deps the ops already have, so the lazy build differs from the record build, and the comparison fails."""
    rs = resolved("llama2-70b-h100-pp4", {"parallel.p2p_overlap": False}, 8)
    ref = _build(rs, False, 0, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(StageOps, "deps_of", lambda self, i: ())
        lazy = _build(rs, True, 0, monkeypatch)
    with pytest.raises(AssertionError):
        _same_build(lazy, ref)


def _templates() -> list[Template]:
    """Two blocks: a forward one on an input (a collective, a host sync, an op on two inputs) and a backward
    one on the gradient."""
    fwd = Template()
    a = fwd.add("fwd", "a", Gemm(8, 8, 8), ("in",))
    b = fwd.add("fwd", "b", Collective("all_reduce", "tp", 64), (a,))
    fwd.add("fwd", "c", Elementwise("norm", 4, 4), (), host_calls=3, host_wait=b)
    fwd.marks["out"] = fwd.add("fwd", "d", Elementwise("add", 4, 4), (b, "in", "gin"))
    bwd = Template()
    g = bwd.add("bwd", "g", Gemm(4, 4, 4), ("gin",))
    bwd.marks["out"] = bwd.add("bwd", "h", Elementwise("add", 2, 2), (g, "gin"))
    return [fwd, bwd]


@st.composite
def calls(draw):
    """A reserved count and builder calls: ("stamp", template, layer, mb, ext pick, gate picks, no input),
    ("append", deps picks), ("replace", position pick, deps picks); picks are fractions of the length."""
    frac = st.floats(0, 1, exclude_max=True)
    call = st.one_of(
        st.tuples(st.just("stamp"), st.integers(0, 1), st.sampled_from([None, 0, 3]), st.integers(0, 2),
                  st.lists(frac, min_size=2, max_size=2), st.lists(frac, max_size=2),
                  st.sampled_from([False] * 9 + [True])),
        st.tuples(st.just("append"), st.lists(frac, max_size=3)),
        st.tuples(st.just("replace"), frac, st.lists(frac, max_size=2), st.booleans()))
    return draw(st.integers(0, 3)), draw(st.lists(call, min_size=1, max_size=25))


def _apply(ops, reserved: int, steps, tpls) -> None:
    def pick(f: float) -> int:
        return int(f * len(ops))

    for step in steps:
        if step[0] == "stamp":
            _, k, layer, mb, ext, gate, missing = step
            inputs = {"in": pick(ext[0]) if len(ops) else 0, "gin": pick(ext[1]) if len(ops) else 0}
            if missing:
                inputs["gin"] = None  # an input the builder never made: the record is dropped
            prefix = f"L{layer}.mb{mb}." if layer is not None else f"head.mb{mb}."
            stamp(tpls[k], ops, prefix, inputs, layer, mb, tuple(pick(f) for f in gate) if len(ops) else ())
        elif step[0] == "append":
            deps = tuple(pick(f) for f in step[1]) if len(ops) else ()
            ops.append(Op(len(ops), f"p2p{len(ops)}", "pp_comm", "pp_comm", "fwd", Elementwise("k", 1, 1), deps,
                          None, 0))
        elif len(ops) > reserved:
            _, at, deps, negative = step
            i = reserved + int(at * (len(ops) - reserved))
            new = replace(ops[i], deps=ops.deps_of(i) + tuple(pick(f) for f in deps))
            ops[i - len(ops) if negative else i] = new


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=calls(), data=st.data())
def test_stage_ops_read_as_the_op_list_after_the_same_calls(case, data):
    reserved, steps = case
    tpls = _templates()
    lazy, ref = StageOps(reserved), OpList([None] * reserved)
    _apply(lazy, reserved, steps, tpls)
    _apply(ref, reserved, steps, tpls)
    n = len(ref)
    assert len(lazy) == n and list(lazy) == list(ref) and list(reversed(lazy)) == list(reversed(ref))
    assert [lazy[i] for i in range(-n, n)] == [ref[i] for i in range(-n, n)]
    assert [lazy.deps_of(i) for i in range(reserved, n)] == [ref.deps_of(i) for i in range(reserved, n)]
    bound = st.integers(-n - 2, n + 2)
    for lo, hi, step in data.draw(st.lists(st.tuples(bound, bound, st.sampled_from([1, 2, -1])), max_size=4)):
        assert list(lazy[lo:hi:step]) == ref[lo:hi:step]
    for start in range(reserved, n + 1):
        for phase, mb in (("fwd", 0), ("bwd", 1), ("fwd", 2)):
            want = [(op.id, op.layer, op.name) for op in ref[start:] if (op.phase, op.micro_batch) == (phase, mb)]
            assert list(lazy.where(start, phase, mb)) == want
        owners = {_owner(op) for op in ref[start:]}
        assert _first_forward_use(lazy, start, owners) == _first_forward_use(ref, start, owners)
        assert lazy.ids_are_positions(start)
    ta, tb = lazy.tiling, ref.tiling
    assert (ta.broken, ta.dirty, ta.gated, ta.order) == (tb.broken, tb.dirty, tb.gated, tb.order)
    for min_ops in (0, n, n + 1):
        tiling.STAMPED_MIN_OPS, before = min_ops, tiling.STAMPED_MIN_OPS
        try:
            got, want = lazy.frozen(), ref.frozen()
        finally:
            tiling.STAMPED_MIN_OPS = before
        assert type(got) is type(want) and tuple(got) == tuple(want)
        if isinstance(want, StampedOps):
            assert list(got._loose.items()) == list(want._loose.items())
