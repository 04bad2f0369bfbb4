"""Schedules stamped from templates (sim/schedule/stamping.py, stencil.py) and their arrays tiled from the stamps
(sim/schedule/tiling.py): the tiled arrays equal the ones read off the Op records (ops.arrays_from_ops) on
generated schedules of every builder path (dense, FSDP, 1F1B and interleaved pipelines with and without P2P
overlap and scatter-gather, MoE with and without the combined EP-overlap schedule, CP, FP8 recipes, MLA + MTP,
parameter-gather overlap, recompute); golden stamps and arrays on a hand-built template; the Op record keeps
the frozen dataclass's API."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_steady_state import resolved

from meshsim.scenarios.load import load_scenario
from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule.ops import (
    Collective,
    Elementwise,
    Gemm,
    Op,
    Schedule,
    ScheduleArrays,
    arrays_from_ops,
)
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.schedule.stamping import stamp
from meshsim.sim.schedule.template import Template
from meshsim.sim.schedule.tiling import OpList

LIBRARY = ["tiny-2gpu", "llama2-70b-h100-pp4", "gpt3-175b-a100-pp8", "llama3-70b-h100-cp2", "llama3-8b-h100-fp8",
           "llama3-8b-h100-fsdp", "llama3-8b-gb300-nvfp4", "llama3-8b-128k-h100-cp4", "mixtral-8x7b-h100-ep8",
           "qwen3-30b-a3b-h100-ep16", "gpt-oss-120b-h100-pp4-ep8", "deepseek-v3-h100-ep64",
           "deepseek-v3-gb300-ep32-mxfp8", "llama31-405b-h100-tp8-pp8-cp2"]


def _block() -> Template:
    """A 4-op block: an entry op on the input, a collective after it, a host sync, and an op on two inputs."""
    tpl = Template()
    a = tpl.add("fwd", "a", Gemm(8, 8, 8), ("in",))
    b = tpl.add("fwd", "b", Collective("all_reduce", "tp", 64), (a,))
    tpl.add("fwd", "c", Elementwise("norm", 4, 4), (), host_calls=3, host_wait=b)
    tpl.marks["out"] = tpl.add("fwd", "d", Elementwise("add", 4, 4), (b, "in", "gin"))
    return tpl


def test_stamp_golden():
    """Ids from the list's length, names prefixed, local deps offset, ext inputs and the gate (entry ops only)
    appended after them, host waits offset."""
    ops = OpList([Op(0, "x", "compute", "compute", "fwd", Elementwise("k", 1, 1))])
    tpl = _block()
    assert stamp(tpl, ops, "L0.mb0.", {"in": 0, "gin": 0}, 0, 0) == 1
    assert stamp(tpl, ops, "L1.mb0.", {"in": 4, "gin": 2}, 1, 0, gate=(3,)) == 5
    got = [(op.id, op.name, op.stream, op.deps, op.layer, op.micro_batch, op.host_calls, op.host_wait) for op in ops[1:]]
    assert got == [
        (1, "L0.mb0.fwd.a", "compute", (0,), 0, 0, 2, None), (2, "L0.mb0.fwd.b", "tp_comm", (1,), 0, 0, 2, None),
        (3, "L0.mb0.fwd.c", "compute", (), 0, 0, 3, 2), (4, "L0.mb0.fwd.d", "compute", (2, 0, 0), 0, 0, 2, None),
        (5, "L1.mb0.fwd.a", "compute", (4, 3), 1, 0, 2, None), (6, "L1.mb0.fwd.b", "tp_comm", (5,), 1, 0, 2, None),
        (7, "L1.mb0.fwd.c", "compute", (3,), 1, 0, 3, 6), (8, "L1.mb0.fwd.d", "compute", (6, 4, 2), 1, 0, 2, None)]


def test_arrays_golden_and_tiled():
    ops = OpList([Op(0, "x", "compute", "compute", "fwd", Elementwise("k", 1, 1))])
    tpl = _block()
    stamp(tpl, ops, "L0.mb0.", {"in": 0, "gin": 0}, 0, 0)
    stamp(tpl, ops, "L1.mb0.", {"in": 4, "gin": 2}, 1, 0, gate=(3,))
    s = Schedule(ops_t := tuple(ops), 1, 1, 1, tiling=ops.sealed(ops_t))
    want = ScheduleArrays(*(np.array(a, dtype=np.intc) for a in (
        [0, 0, 1, 0, 0, 0, 1, 0, 0], [0, 0, 1, 0, 0, 0, 1, 0, 0], [0, 0, 1, 2, 2, 5, 7, 8, 9, 12],
        [0, 1, 2, 0, 0, 4, 3, 5, 3, 6, 4, 2], [2, 2, 2, 3, 2, 2, 2, 3, 2], [-1, -1, -1, 2, -1, -1, -1, 6, -1])))
    assert arrays_from_ops(s.ops) == want
    assert s.arrays == want
    assert s.tiling.stamps and not s.tiling.broken  # tiled, not read off the ops


def test_tiling_negative_controls():
    """A record that lies (a base moved) gives other arrays: the comparison can fail. A replaced op is read off
    its record; a list changed otherwise drops the record."""
    ops = OpList()
    tpl = _block()
    stamp(tpl, ops, "a.", {"in": 0, "gin": 0}, None, 0)
    stamp(tpl, ops, "b.", {"in": 3, "gin": 1}, None, 0)
    ops[6] = replace(ops[6], deps=(0,))
    s = Schedule(ops_t := tuple(ops), 1, 1, 1, tiling=ops.sealed(ops_t))
    assert s.arrays == arrays_from_ops(s.ops) and list(s.arrays.dep_idx[s.arrays.dep_ptr[6]:s.arrays.dep_ptr[7]]) == [0]
    lying = s.tiling
    next(iter(lying.stamps.values()))[0][1] = 2
    assert lying.arrays(s.ops) != arrays_from_ops(s.ops)
    assert lying.arrays(tuple(list(s.ops))) == arrays_from_ops(s.ops)  # not the record's ops: read off them
    ops.insert(0, ops[0])
    assert ops.tiling.broken


def test_op_keeps_the_dataclass_api():
    op = Op(3, "L0.mb0.fwd.a", "compute", "compute", "fwd", Gemm(2, 3, 4), (1, 2), 0, 0)
    assert dataclasses.is_dataclass(op) and [f.name for f in dataclasses.fields(op)][-2:] == ["host_calls", "host_wait"]
    assert (op.host_calls, op.host_wait, op.flops) == (2, None, 48.0)
    moved = dataclasses.replace(op, deps=(0,), host_wait=1)
    assert moved.deps == (0,) and moved.host_wait == 1 and moved.name == op.name and moved != op
    assert pickle.loads(pickle.dumps(op)) == op and hash(pickle.loads(pickle.dumps(op))) == hash(op)
    assert dataclasses.asdict(op)["work"] == {"m": 2, "n": 3, "k": 4, "batch": 1, "out_bytes": 2, "fp8": False,
                                              "comm_sms": 0}
    with pytest.raises(AttributeError):
        op.deps = ()
    with pytest.raises(AttributeError):
        op.extra = 1
    assert Op(0, "c", "tp_comm", "tp_comm", "fwd", Collective("all_reduce", "tp", 8)).flops == 0.0


def test_pickled_schedule_drops_the_record():
    s = build_stage_schedules(resolved("tiny-2gpu", {}, 2))[0]
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.tiling is None and back.arrays == s.arrays


@st.composite
def scenarios(draw):
    """A library scenario cut to a few layers and micro-batches, with the switches that pick builder paths
    (each drawn only where Megatron allows it, so most draws resolve)."""
    name = draw(st.sampled_from(LIBRARY))
    p = load_scenario(name)[0].parallel
    moe = load_scenario(name)[0].model.moe is not None
    pp, vp = draw(st.sampled_from([(p.pp, p.vp), (p.pp, p.vp), (p.pp, 1), (1, 1), (2, 1), (2, 2), (4, 2)]))
    extra = p.account_for_embedding_in_split + p.account_for_loss_in_split  # layers the split counts besides
    over: dict = {"parallel.first_stage_layers": None, "parallel.last_stage_layers": None, "parallel.pp": pp,
                  "parallel.vp": vp, "parallel.dp": "auto", "parallel.pipeline_layout": None,
                  "model.layers": pp * vp * draw(st.integers(1, 2)) - (extra if pp > 1 else 0)}
    if pp > 1:
        over["parallel.fsdp"] = False
    flips = ["parallel.dp_overlap", "parallel.distributed_optimizer", "parallel.p2p_overlap",
             "parallel.p2p_scatter_gather"] + (["parallel.moe_ep_overlap"] if moe else []) + \
        (["parallel.fsdp"] if pp == 1 else [])
    for key in flips:
        flip = draw(st.sampled_from([None, None, True, False]))
        if flip is not None:
            over[key] = flip
    if not p.recompute_modules:
        over["parallel.recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
    return name, over, (pp if vp > 1 else 1) * draw(st.integers(1, 3))


def resolved_case(case):
    """A generated case (scenarios()) resolved, or the example dropped: a layout the checks refuse."""
    name, over, micro_batches = case
    try:
        return resolved(name, over, micro_batches)
    except UserError:
        assume(False)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_tiled_arrays_equal_arrays_read_off_the_ops(case):
    rs = resolved_case(case)
    for s in build_stage_schedules(rs):
        assert s.tiling is not None and not s.tiling.broken  # (the combined EP-overlap plans stamp op by op)
        assert s.arrays == arrays_from_ops(s.ops)
