"""Differential test of the array versions of the steady-state proof, the critical path and the breakdown
(sim/results/period_proof.py, period_state.py, period_keys.py, run_arrays.py, critical_path.py,
breakdown.py) against today's per-event code, kept verbatim as the reference (tests/results_reference/):
on generated runs the two give bit-identical answers (==, not a tolerance): the critical path segment by
segment, the breakdown key by key, the proof's verdict (its reason word for word, or its cut, period,
periods, stage maps and stream predecessors), and the extended critical path. The generator aims at the
edges: hosts within 15% of the GPU (host-bound and barely ahead), CUDA graphs, 1F1B and interleaved
pipelines, DP overlap and parameter gathers, FSDP, TP comm overlap, interference, MoE with EP (and its
overlap), CP, zero-duration and tied intervals, and plans whose cuts are off the period (so that every
check's failure is compared too). The negative control shows that the comparison sees one ulp."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from results_reference import breakdown as ref_breakdown
from results_reference import critical_path as ref_critical_path
from results_reference import period_proof as ref_period_proof
from results_reference import period_state as ref_period_state
from test_steady_state import resolved
from test_steady_state_generated import HOST, _no_pp, host, no_pp

from meshsim.sim.core.errors import UserError
from meshsim.sim.engine.events import EventLog
from meshsim.sim.results import breakdown, critical_path, period_path, period_proof, period_state
from meshsim.sim.results import simulate as sim_glue

FAST = (critical_path, breakdown, period_proof, period_path, period_state)
# period_path is not an array version (the array work left it as it was): both sides extend with it
REFERENCE = (ref_critical_path, ref_breakdown, ref_period_proof, period_path, ref_period_state)
MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def fresh(log: EventLog) -> EventLog:
    """The log without its built indexes (each implementation builds its own)."""
    return EventLog(log.events, log.ranks, log.step_time_s, transfers=log.transfers, jobs=log.jobs)


def proof_fields(proof) -> object:
    """A verdict as plain values: the reason, or the proof's cut, periods, stream predecessors and maps."""
    if isinstance(proof, str):
        return proof
    cut = proof.cut
    return ((cut.c1, cut.period_s, cut.tol_s, cut.kappa), proof.periods, proof.prevs,
            [(m.keys, m.id_of, m.unit, m.period_ops, m.first_regular, m.end_regular) for m in proof.maps])


def analyses(mods, run, lead: int, unit: int, micro_batches: int, stage_of, pipeline: bool) -> dict:
    """Everything the step's figures are made of, by one implementation, as plain values."""
    cp_mod, bd_mod, proof_mod, path_mod, state_mod = mods
    log = fresh(run.log)
    path = cp_mod.critical_path(run.schedules, log)
    split = bd_mod.breakdown(log.of_rank(log.ranks[0]), log.step_time_s, pipeline=pipeline)
    proof = proof_mod.prove(run.schedules, log, lead, unit, micro_batches, stage_of, run.issue_s, run.kappa,
                            path_mod.inside_an_op(path))
    extended = None if isinstance(proof, str) else path_mod.extend_path(path, run.schedules, log, proof)
    maps = [state_mod.stage_map(s, lead, unit) for s in run.schedules]
    return {"path": [s.to_json() for s in path], "breakdown": split, "proof": proof_fields(proof),
            "extended": extended if extended is None or isinstance(extended, str) else [s.to_json() for s in extended],
            "maps": [m if isinstance(m, str) else (m.keys, m.period_ops, m.first_regular, m.end_regular) for m in maps],
            "union": bd_mod.union_s([(e.start_s, e.end_s) for e in log.events[:200]])}


def same(a, b) -> bool:
    """Equal to the bit: floats by their bits (so -0.0 is not 0.0 and NaN is itself), containers item by item."""
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex() if not (math.isnan(a) and math.isnan(b)) else True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def check(rs, lead_shift: int, extra_periods: int) -> None:
    """The run of rs's steady plan (its lead moved by lead_shift micro-batches, within the run), fast vs
    reference, for a step extra_periods periods longer than the run."""
    plan = sim_glue.steady_plan(rs)
    n_b = plan.lead + 2 * plan.unit + plan.tail
    run = sim_glue._short_run(rs, n_b, False, sim_glue.CollectiveCoster(rs), None)
    lead = min(max(0, plan.lead + lead_shift), n_b - plan.unit - 1)
    args = (run, lead, plan.unit, n_b + extra_periods * plan.unit, rs.stage_of, rs.pp > 1)
    fast, reference = analyses(FAST, *args), analyses(REFERENCE, *args)
    for key in reference:
        assert same(fast[key], reference[key]), key
    verdict = reference["proof"]
    outcomes["proven" if not isinstance(verdict, str) else verdict.split(" (")[0].split(":")[-1][:40]] += 1


outcomes: Counter = Counter()
SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}


@settings(max_examples=30, **SETTINGS)
@given(overrides=no_pp, host_mode=HOST, lead_shift=st.sampled_from([0, 0, 0, -1, 1]), extra=st.integers(1, 3))
def test_arrays_equal_the_reference_without_pipelines(overrides, host_mode, lead_shift, extra):
    o = _no_pp(overrides, host_mode)
    check(resolved("tiny-2gpu", o, 48), lead_shift, extra)


pipelined = st.fixed_dictionaries({
    "parallel.pp": st.sampled_from([2, 3, 4]),
    "parallel.vp": st.sampled_from([1, 1, 2]),
    "parallel.tp": st.sampled_from([1, 2]),
    "parallel.sp": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallel.distributed_optimizer": st.booleans(),
    "parallel.dp_overlap": st.booleans(),
    "parallel.p2p_overlap": st.booleans(),
    "hardware.compute.comm_interference": st.sampled_from([0.0, 0.0, 0.3]),
    "moe": st.sampled_from([False, False, True]),
    "parallel.moe_ep_overlap": st.booleans(),
    "parallel.cp": st.sampled_from([1, 1, 2]),
})


@settings(max_examples=30, **SETTINGS)
@given(overrides=pipelined, host_mode=HOST, lead_shift=st.sampled_from([0, 0, 0, -1, 1]), extra=st.integers(1, 2))
def test_arrays_equal_the_reference_on_pipelines_moe_and_cp(overrides, host_mode, lead_shift, extra):
    o = dict(overrides)
    pp, vp, tp, moe, cp = o["parallel.pp"], o["parallel.vp"], o["parallel.tp"], o.pop("moe"), o["parallel.cp"]
    if vp > 1:
        o["parallel.pp"] = pp = min(pp, 3)
        o["parallel.p2p_overlap"] = o["parallel.p2p_overlap"] and pp > 2  # Megatron: blocking P2P with 2 stages
    o["parallel.moe_ep_overlap"] = o["parallel.moe_ep_overlap"] and moe and vp > 1
    o.update({"model.layers": pp * vp, "parallel.gpus": tp * pp * cp * 2, "parallel.dp": "auto",
              "parallel.sp": o["parallel.sp"] and tp > 1, "topology.nodes": 4, "parallel.micro_batch": 1})
    if moe:
        o.update({**MOE, "parallel.ep": 2, "parallel.sp": tp > 1})  # Megatron: MoE with tp > 1 needs SP
    try:
        o.update(host(o, *host_mode))
        rs = resolved("tiny-2gpu", o, 48)
    except UserError:  # a layout meshsim refuses (its message names the rule): not a run to compare
        assume(False)
    check(rs, lead_shift, extra)


@settings(max_examples=200, **SETTINGS)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.5, 3.0, 1e-9, 0.1 + 0.2]),
                          st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 0.3, 1e-9])), max_size=12))
def test_union_equals_the_reference_with_ties_empty_and_reversed_intervals(intervals):
    starts = np.array([s for s, _ in intervals], np.float64)
    ends = np.array([e for _, e in intervals], np.float64)
    assert same(breakdown.union_of(starts, ends), ref_breakdown.union_s(intervals))
    assert same(breakdown.union_s(intervals), ref_breakdown.union_s(intervals))


def test_print_the_verdicts_compared():
    """Not a check: how often the runs compared above were proven, and which checks refused the others
    (run with -s to see it)."""
    print("\nverdicts compared:", dict(outcomes.most_common()))


def test_the_comparison_sees_one_ulp_negative_control():
    """A result one ulp off, a reason one word off, a segment moved: each is told apart from the real one."""
    rs = resolved("tiny-2gpu", {"parallel.pp": 2, "model.layers": 2, "parallel.gpus": 4, "parallel.dp": "auto",
                                "run.cuda_graphs": True}, 48)
    plan = sim_glue.steady_plan(rs)
    n_b = plan.lead + 2 * plan.unit + plan.tail
    run = sim_glue._short_run(rs, n_b, False, sim_glue.CollectiveCoster(rs), None)
    args = (run, plan.lead, plan.unit, n_b + plan.unit, rs.stage_of, True)
    fast, reference = analyses(FAST, *args), analyses(REFERENCE, *args)
    assert same(fast, reference) and not isinstance(fast["proof"], str)  # proven: every part is compared
    bumped = {**fast["breakdown"], "compute_busy": math.nextafter(fast["breakdown"]["compute_busy"], math.inf)}
    assert not same({**fast, "breakdown": bumped}, reference)
    path = [dict(s) for s in fast["path"]]
    path[len(path) // 2]["start_us"] = math.nextafter(path[len(path) // 2]["start_us"], -math.inf)
    assert not same({**fast, "path": path}, reference)
    cut, *rest = fast["proof"]
    assert not same({**fast, "proof": ((math.nextafter(cut[0], 0.0), *cut[1:]), *rest)}, reference)
    assert not same({**fast, "proof": "the period is not longer than the tolerance"}, reference)
    assert not same(0.0, -0.0) and same(replace(run.path[0]).to_json(), run.path[0].to_json())
