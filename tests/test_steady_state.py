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


def resolved(name: str, overrides: dict | None = None):
    scenario, source = load_scenario(name)
    rs = resolve(with_overrides(scenario, overrides or {}, source), source)
    if rs.micro_batches < MIN_MICRO_BATCHES:
        per_mb = rs.scenario.parallel.micro_batch * rs.dp
        rs = resolve(with_overrides(scenario, {**(overrides or {}), "parallel.global_batch":
                                               per_mb * MIN_MICRO_BATCHES}, source), source)
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


def assert_same_step(ex, full) -> None:
    """Extrapolated vs whole: every time within (periods + 1) x the check's tolerance; the critical path,
    expanded, is the whole one segment by segment (op types, ranks, categories, times)."""
    state = ex.steady_state
    assert state is not None and full.steady_state is None
    tol_s = 2 * (state["periods"] + 1) * REL_TOL * full.step_time_s
    assert ex.step_time_s == pytest.approx(full.step_time_s, rel=0, abs=tol_s)
    for key, value in full.breakdown_s.items():
        assert ex.breakdown_s[key] == pytest.approx(value, rel=0, abs=tol_s), key
    for key, value in full.critical_path_share.items():
        assert ex.critical_path_share[key] == pytest.approx(value, rel=0, abs=tol_s / full.step_time_s), key
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


def _not_pipelined(name: str) -> bool:
    return resolved(name).pp == 1


@pytest.mark.parametrize("name", [n for n in sorted(builtin_scenarios()) if _not_pipelined(n)])
def test_extrapolation_equals_the_whole_simulation_on_every_library_scenario(name):
    rs = resolved(name)
    ex = simulate_steady(rs, force=True)
    assert ex is not None, "the library scenarios are periodic: the check must pass"
    assert_same_step(ex, simulate(rs, full=True))


def test_a_pipeline_is_simulated_whole():
    """No steady plan for pipelines yet (pp > 1): simulate() runs every micro-batch."""
    from meshsim.scenarios.load import load_scenario, resolve, with_overrides

    scenario, source = load_scenario("tiny-2gpu")
    rs = resolve(with_overrides(scenario, {"parallel.gpus": 8, "parallel.pp": 2, "parallel.global_batch": 64},
                                source), source)
    assert simulate_steady(rs, force=True) is None
    assert simulate(rs).step_time_s == simulate(rs, full=True).step_time_s


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


def test_a_straggler_breaks_the_period_and_the_whole_step_is_simulated(monkeypatch):
    """Negative control: micro-batch 2 computes 1% slower, so the two short runs are not one period apart."""
    rs = resolved("tiny-2gpu", {"parallel.global_batch": 2 * 8})
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
