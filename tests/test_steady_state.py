"""Steady-state extrapolation (sim/results/steady_state.py) equals the whole simulation to the last digit its
periodicity check allows: on every library scenario, on random small scenarios (hypothesis), and it
falls back to the whole simulation when a straggler breaks the period (negative control)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.library import builtin_scenarios
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.outputs.step_report import write_outputs
from meshsim.sim.results import simulate as sim_glue
from meshsim.sim.results.critical_path import op_type
from meshsim.sim.results.simulate import simulate, simulate_steady
from meshsim.sim.results.steady_state import REL_TOL, Plan

MIN_MICRO_BATCHES = 6  # more than the longer short run (4), so there is something to extrapolate


def least_micro_batches(rs) -> int:
    """One period more than the longer short run (pipelines: it depends on p, v and N)."""
    plan = sim_glue.steady_plan(rs)
    return max(MIN_MICRO_BATCHES, plan.lead + plan.tail + 3 * plan.unit)


def pipeline_micro_batches(rs) -> int:
    """Pipelines: two extrapolated periods (the whole step it is compared with stays affordable)."""
    return least_micro_batches(rs) + sim_glue.steady_plan(rs).unit


def resolved(name: str, overrides: dict | None = None):
    scenario, source = load_scenario(name)
    rs = resolve(with_overrides(scenario, overrides or {}, source), source)
    want = pipeline_micro_batches(rs) if rs.pp > 1 else max(rs.micro_batches, least_micro_batches(rs))
    if rs.micro_batches != want:
        per_mb = rs.scenario.parallel.micro_batch * rs.dp
        rs = resolve(with_overrides(scenario, {**(overrides or {}), "parallel.global_batch": per_mb * want},
                                    source), source)
    return rs


def expand(path: list[dict], period_us: float) -> list[dict]:
    """The op-by-op critical path: the run of segments of count c (one period) repeated c times, one
    period apart."""
    block = [i for i, seg in enumerate(path) if seg["count"] > 1]
    if not block:
        return path
    i, j, count = block[0], block[-1] + 1, path[block[0]]["count"]
    assert block == list(range(i, j)) and all(seg["count"] == count for seg in path[i:j])
    repeated = [{**seg, "start_us": seg["start_us"] + k * period_us, "count": 1}
                for k in range(count) for seg in path[i:j]]
    return path[:i] + repeated + path[j:]


def assert_same_step(ex, full, path_tie_rel: float = 0.0) -> None:
    """Extrapolated vs whole: every time within (periods + 1) x the check's tolerance; the critical path,
    expanded, is the whole one segment by segment (op types, ranks, categories, times). `path_tie_rel` > 0:
    the two paths may take different routes between predecessors that end at the same time (a round-off
    tie-break), so only the shares are compared, to that relative tolerance."""
    state = ex.steady_state
    assert state is not None and full.steady_state is None
    tol_s = 2 * (state["periods"] + 1) * REL_TOL * full.step_time_s
    assert ex.step_time_s == pytest.approx(full.step_time_s, rel=0, abs=tol_s)
    for key, value in full.breakdown_s.items():
        assert ex.breakdown_s[key] == pytest.approx(value, rel=0, abs=tol_s), key
    for key, value in full.critical_path_share.items():
        abs_tol = max(tol_s / full.step_time_s, path_tie_rel)
        assert ex.critical_path_share[key] == pytest.approx(value, rel=0, abs=abs_tol), key
    if path_tie_rel:
        return
    assert (ex.layer_fwd_ms, ex.layer_bwd_ms) == (full.layer_fwd_ms, full.layer_bwd_ms)
    assert ex.ops_per_rank == full.ops_per_rank and ex.collectives == full.collectives
    assert (ex.memory_gb, ex.config) == (full.memory_gb, full.config)
    path = expand(list(ex.critical_path), state["period_s"] * 1e6)
    assert len(path) == len(full.critical_path)
    tol_us = tol_s * 1e6
    for a, b in zip(path, full.critical_path, strict=True):  # plain comparisons: ~50k segments
        assert (op_type(a["name"]), a["category"]) == (op_type(b["name"]), b["category"]), (a, b)
        # with explicit ranks, which symmetric copy the path passes through is a round-off tie-break
        assert a["rank"] == b["rank"] or ex.explicit_ranks, (a, b)
        assert abs(a["start_us"] - b["start_us"]) <= tol_us and abs(a["dur_us"] - b["dur_us"]) <= tol_us, (a, b)


@pytest.mark.parametrize("name", sorted(builtin_scenarios()))
def test_extrapolation_equals_the_whole_simulation_on_every_library_scenario(name):
    rs = resolved(name)
    ex = simulate_steady(rs, force=True)
    assert ex is not None, "the library scenarios are periodic: the check must pass"
    # gpt3-175b-a100-pp8: the whole step's path takes another, equally long route through one round
    assert_same_step(ex, simulate(rs, full=True), path_tie_rel=1e-4 if name == "gpt3-175b-a100-pp8" else 0.0)


def test_pipeline_plans_follow_the_warm_up():
    """1F1B: p lead, p - 1 trail, period 1; interleaved: period N, lead and tail from 2 (p - 1) + (v - 1) N."""
    def plan(pp, vp, layers):
        return sim_glue.steady_plan(resolved("tiny-2gpu", {"parallel.gpus": 2 * pp, "parallel.pp": pp, "parallel.vp": vp,
                                                           "topology.nodes": 2, "model.layers": layers,
                                                           "parallel.global_batch": 128 * pp}))
    assert plan(1, 1, 2) == Plan(1, 1, 1)
    assert plan(4, 1, 4) == Plan(lead=4, tail=3, unit=1)
    assert plan(4, 2, 8) == Plan(lead=12, tail=8, unit=4)  # w = 10 forwards over E = 8 per group: 2 groups
    assert plan(8, 4, 32) == Plan(lead=24, tail=16, unit=8)  # w = 38, E = 32


small = st.fixed_dictionaries({
    "model.layers": st.integers(1, 3),
    "parallel.tp": st.sampled_from([1, 2, 4]),
    "parallel.sp": st.booleans(),
    "parallel.micro_batch": st.sampled_from([1, 2]),
    "parallel.tp_comm_overlap": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallel.distributed_optimizer": st.booleans(),
    "parallel.dp_overlap": st.booleans(),
    "parallel.gpus": st.sampled_from([4, 8, 16]),
    "topology.nodes": st.just(2),
    "model.seq_len": st.sampled_from([128, 512]),
})


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=small, micro_batches=st.integers(MIN_MICRO_BATCHES, 11), explicit=st.booleans())
def test_extrapolation_equals_the_whole_simulation_on_random_small_scenarios(overrides, micro_batches, explicit):
    if overrides["parallel.sp"] and overrides["parallel.tp"] == 1:
        overrides = {**overrides, "parallel.sp": False}
    dp = overrides["parallel.gpus"] // overrides["parallel.tp"]
    batch = overrides["parallel.micro_batch"] * dp * micro_batches
    rs = resolved("tiny-2gpu", {**overrides, "parallel.dp": "auto", "parallel.global_batch": batch})
    ex = simulate_steady(rs, explicit_ranks=explicit, force=True)
    assert ex is not None
    assert_same_step(ex, simulate(rs, explicit_ranks=explicit, full=True))


pipelined = st.fixed_dictionaries({
    "parallel.pp": st.sampled_from([2, 3, 4]),
    "parallel.vp": st.sampled_from([1, 2]),
    "layers_per_chunk": st.integers(1, 2),
    "parallel.tp": st.sampled_from([1, 2]),
    "parallel.sp": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallel.distributed_optimizer": st.booleans(),
    "parallel.dp_overlap": st.booleans(),
    "parallel.p2p_overlap": st.booleans(),
    "dp": st.sampled_from([1, 2]),
    "run.cuda_graphs": st.booleans(),
})


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=pipelined, extra_periods=st.integers(1, 3), explicit=st.booleans())
def test_extrapolation_equals_the_whole_simulation_on_random_small_pipelines(overrides, extra_periods, explicit):
    """Small GPU-bound pipelines (hidden 4096, seq 2048: a stage computes longer than its host takes to issue
    its ops; a host-bound stage would catch up with its GPU over many periods and the check would fail)."""
    o = dict(overrides)
    pp, vp, tp, dp = o["parallel.pp"], o["parallel.vp"], o["parallel.tp"], o.pop("dp")
    if vp > 1 and pp < 3:
        o["parallel.p2p_overlap"] = False  # interleaving with 2 stages needs blocking P2P (Megatron's rule)
    o.update({"model.layers": pp * vp * o.pop("layers_per_chunk"), "parallel.gpus": tp * pp * dp,
              "parallel.dp": "auto", "parallel.sp": o["parallel.sp"] and tp > 1, "topology.nodes": 4,
              "model.hidden": 4096, "model.heads": 32, "model.seq_len": 2048, "parallel.micro_batch": 1})
    rs = resolved("tiny-2gpu", {**o, "parallel.global_batch": dp * pp * 16})  # any valid batch, for the plan
    plan = sim_glue.steady_plan(rs)
    m = plan.lead + plan.tail + (2 + extra_periods) * plan.unit
    rs = resolved("tiny-2gpu", {**o, "parallel.global_batch": dp * m})
    ex = simulate_steady(rs, explicit_ranks=explicit, force=True)
    assert ex is not None
    assert_same_step(ex, simulate(rs, explicit_ranks=explicit, full=True))


@pytest.mark.parametrize("overrides", [{"parallel.global_batch": 2 * 8},
                                       {"parallel.gpus": 8, "parallel.pp": 4, "model.layers": 4,
                                        "parallel.global_batch": 2 * 2 * 12, "run.cuda_graphs": True}],
                         ids=["no-pp", "1f1b"])
def test_a_straggler_breaks_the_period_and_the_whole_step_is_simulated(monkeypatch, overrides):
    """Negative control: micro-batch 2 computes 1% slower, so the two short runs are not one period apart
    (for the pipeline, a control run without the straggler passes the check)."""
    rs = resolved("tiny-2gpu", overrides)
    if rs.pp > 1:
        assert simulate_steady(rs, force=True) is not None
    real = sim_glue.compute_fn

    def straggling(rs_):
        compute_s = real(rs_)
        return lambda op, rank: compute_s(op, rank) * (1.01 if op.micro_batch == 2 else 1.0)

    monkeypatch.setattr(sim_glue, "compute_fn", straggling)
    assert simulate_steady(rs, force=True) is None
    result = simulate(rs)
    assert result.steady_state is None and result == simulate(rs, full=True)


def test_short_runs_are_a_whole_number_of_periods_and_only_used_when_cheaper():
    plan = Plan()
    assert plan.runs(16) == (3, 4) and plan.runs(7) is None and plan.runs(8) == (3, 4)
    assert plan.runs(5, force=True) == (3, 4) and plan.runs(4, force=True) is None
    pipeline = Plan(lead=3, tail=3, unit=4)  # e.g. interleaved stages: periods of 4 micro-batches
    for m in range(40, 48):
        n_a, n_b = pipeline.runs(m)
        assert n_b == n_a + 4 and (m - n_b) % 4 == 0 and n_a >= 10


def test_an_extrapolated_trace_shows_the_simulated_micro_batches_and_summarises_the_rest(tmp_path):
    rs = resolved("tiny-2gpu", {"parallel.global_batch": 2 * 10})  # 10 micro-batches: 4 simulated, 6 periods
    result = simulate(rs)
    state = result.steady_state
    assert state["periods"] == 6 and state["simulated_micro_batches"] == 4
    write_outputs(result, result.events, tmp_path, html=False)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    summary = [e for e in events if e.get("cat") == "extrapolated"]
    assert len(summary) == 1 and summary[0]["dur"] == pytest.approx(6 * state["period_s"] * 1e6, abs=1e-3)
    ops = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    assert {e["args"]["micro_batch"] for e in ops} == {None, 0, 1, 2, 3}
    # the last op ends at the whole step's end: ops after the gap sit where the whole step puts them
    assert max(e["ts"] + e["dur"] for e in ops) == pytest.approx(result.step_time_s * 1e6, abs=1e-3)
    gap_end_us = summary[0]["ts"] + summary[0]["dur"]
    assert all(e["ts"] >= gap_end_us - 1e-3 for e in ops if e["args"]["micro_batch"] == 3)


def gpt3_interleaved(vp: int):
    """GPT-3 175B, tp 8, pp 4, dp 4, 48 micro-batches; v 12 is one layer per chunk, the structure of the pp 8
    v 12 benchmark case (benchmarks/run.py gpt3-pp8-v12-1024gpu). steady_plan's runs (24 + 28 micro-batches)
    would cost more than the step, short_steady_plan's (20 + 24) less."""
    scenario, source = load_scenario("gpt3-175b-a100-pp8")
    return resolve(with_overrides(scenario, {"parallel.pp": 4, "parallel.vp": vp, "model.layers": 48,
                                             "parallel.global_batch": 4 * 48}, source), source)


def test_interleaved_v12_extrapolates_from_the_short_plan_exactly():
    rs = gpt3_interleaved(12)
    assert sim_glue.steady_plan(rs).runs(rs.micro_batches) is None
    assert sim_glue.plan_and_runs(rs, force=False) == (Plan(lead=8, tail=8, unit=4), (20, 24))
    ex = simulate_steady(rs)
    assert ex is not None and ex.steady_state["simulated_micro_batches"] == 24
    # as gpt3-175b-a100-pp8 (and steady_plan's runs here, with force): the whole step's critical path takes
    # another, equally long route through one round; step, breakdown and path shares agree
    assert_same_step(ex, simulate(rs, full=True), path_tie_rel=1e-4)


def test_short_plan_rejected_from_run_b_alone_when_its_lead_has_not_settled(monkeypatch):
    """Negative control: at v 4 the periods 2 and 3 of run B differ (the lead is still settling), so the
    step is simulated whole after one short run, not two."""
    rs = gpt3_interleaved(4)
    assert sim_glue.plan_and_runs(rs, force=False) == (Plan(lead=8, tail=8, unit=4), (20, 24))
    lengths, real = [], sim_glue._short_run
    monkeypatch.setattr(sim_glue, "_short_run", lambda rs_, n, *rest: lengths.append(n) or real(rs_, n, *rest))
    assert simulate_steady(rs) is None and lengths == [24]
