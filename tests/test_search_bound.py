"""Differential test of the search's two lower bounds, each on its own: the cheap level
(sim/search/cheap_bound.py, block templates) and the refined level (sim/search/bound.py, short
schedules, fill and drain, forced gaps) are each <= the simulated step, on generated small scenarios of
six kinds (dense, MoE with and without EP overlap, CP, FP8, host-bound, pipelined), with enough
micro-batches that the refined bound reads the full step off its short schedule (the premise of its
step 5); and negative controls: the bounds are positive, a compute-bound step is bound tightly, and the
gaps add the MoE all-to-all the schedule's dependencies expose."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import meshsim.sim.search.bound as bound_module
from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.results.simulate import simulate
from meshsim.sim.schedule.pipeline_builder import build_stage_schedules
from meshsim.sim.search.bound import lower_bound, short_micro_batches
from meshsim.sim.search.bound_types import Pricer
from meshsim.sim.search.cheap_bound import BlockCosts, cheap_bound
from meshsim.sim.search.pipeline_bound import Pipeline

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}
KINDS = ("dense", "moe", "cp", "fp8", "host", "pipelined")

common = st.fixed_dictionaries({
    "model.layers": st.integers(1, 4),
    "model.hidden": st.sampled_from([256, 1024]),
    "model.seq_len": st.sampled_from([128, 512]),
    "parallel.tp": st.sampled_from([1, 2, 4]),
    "parallel.micro_batch": st.sampled_from([1, 2]),
    "parallel.tp_comm_overlap": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallel.distributed_optimizer": st.booleans(),
    "parallel.dp_overlap": st.booleans(),
    "parallel.fsdp": st.sampled_from([False, False, True]),
    "hardware.compute.comm_interference": st.sampled_from([0.0, 0.0, 0.3]),
    "run.cuda_graphs": st.booleans(),
})


def _kind(kind: str, o: dict, draw) -> dict:
    if kind == "moe":
        o.update(MOE)
        o["parallel.ep"] = draw(st.sampled_from([2, 4, 8]))
        o["parallel.moe_dispatcher"] = draw(st.sampled_from(["alltoall", "allgather", "flex"]))
        if draw(st.booleans()):  # Megatron's combined 1F1B: a layer's dispatch and combine on ep_comm
            o.update({"parallel.moe_ep_overlap": True, "parallel.delay_wgrad_compute": draw(st.booleans()),
                      "parallel.fsdp": False})
    elif kind == "cp":
        o["parallel.cp"] = draw(st.sampled_from([2, 4]))
        o["parallel.cp_comm"] = draw(st.sampled_from(["p2p", "a2a", "allgather"]))
    elif kind == "fp8":
        o["run.fp8"] = draw(st.sampled_from(["delayed", "tensorwise", "blockwise"]))
    elif kind == "host":  # a host slower than the GPU: dispatch of 50-400 us per op
        o["run.cuda_graphs"] = False
        o["hardware.compute.host_dispatch_us"] = draw(st.sampled_from([50.0, 150.0, 400.0]))
    elif kind == "pipelined":
        pp, vp = draw(st.sampled_from([2, 3, 4])), draw(st.sampled_from([1, 1, 2]))
        o.update({"parallel.pp": pp, "parallel.vp": vp, "model.layers": pp * vp * draw(st.integers(1, 2)),
                  "parallel.fsdp": False, "parallel.p2p_overlap": vp == 1 or pp > 2})
    return o


@st.composite
def scenarios(draw):
    kind = draw(st.sampled_from(KINDS))
    o = _kind(kind, dict(draw(common)), draw)
    tp = o["parallel.tp"]
    o["parallel.sp"] = tp > 1
    o["parallel.tp_comm_overlap"] = o["parallel.tp_comm_overlap"] and tp > 1
    if o["parallel.fsdp"]:
        o["parallel.distributed_optimizer"] = True
    dp = draw(st.sampled_from([1, 2]))
    gpus = tp * o.get("parallel.cp", 1) * o.get("parallel.pp", 1) * dp
    micro_batches = draw(st.integers(1, 12))
    o.update({"parallel.gpus": gpus, "topology.nodes": max(1, -(-gpus // 8)), "parallel.dp": "auto",
              "parallel.global_batch": o["parallel.micro_batch"] * dp * micro_batches})
    return kind, o


def resolved(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    try:
        return resolve(with_overrides(scenario, overrides, source), source)
    except UserError:
        return None


seen: dict[str, int] = {}


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=scenarios())
def test_bound_is_at_most_the_simulated_step(case):
    kind, overrides = case
    rs = resolved(overrides)
    assume(rs is not None)
    cheap, bound, step = cheap_bound(rs), lower_bound(rs), simulate(rs).step_time_s
    seen[kind] = seen.get(kind, 0) + 1
    assert 0 < cheap.step_s <= step, ("cheap", kind, overrides, cheap.step_s, step)
    assert 0 < bound.step_s <= step, ("refined", kind, overrides, bound.step_s, step)


def test_every_kind_was_generated():
    """The generator reaches each kind (run after the test above: pytest keeps file order)."""
    assert set(seen) == set(KINDS), seen


def test_bound_reads_the_full_step_off_a_short_schedule(monkeypatch):
    """Premise P of step 5 on a concrete case: the bound from 3 micro-batches equals the bound from the
    full schedule of 12, term by term."""
    rs = resolved({"parallel.global_batch": 2 * 1 * 12})
    assert rs.micro_batches == 12 and short_micro_batches(rs) == 3
    short = lower_bound(rs)
    monkeypatch.setattr(bound_module, "short_micro_batches", lambda r: r.micro_batches)
    exact = lower_bound(rs)
    assert (short.short_micro_batches, exact.short_micro_batches) == (3, 12)
    assert short.step_s == pytest.approx(exact.step_s, rel=1e-12)
    for a, b in zip(short.stages, exact.stages, strict=True):
        assert dict(a.busy_s) == pytest.approx(dict(b.busy_s), rel=1e-12)
        assert a.host_s == pytest.approx(b.host_s, rel=1e-12)


def test_a_compute_bound_step_is_bound_tightly():
    """Negative control against a bound that is trivially small: one GPU, no communication, CUDA graphs:
    the step is its compute stream, and the refined bound is within 1e-6 of it; the cheap one leaves out
    only the step's end (the optimizer), a few percent here."""
    rs = resolved({"parallel.tp": 1, "parallel.gpus": 1, "parallel.global_batch": 8, "run.cuda_graphs": True})
    step = simulate(rs).step_time_s
    assert lower_bound(rs).step_s == pytest.approx(step, rel=1e-6)
    assert 0.9 * step < cheap_bound(rs).step_s < step


def test_the_gaps_hold_the_all_to_all_that_dependencies_expose():
    """MoE without EP overlap: the compute stream idles for each dispatch and combine all-to-all (the expert
    GEMMs wait for the one, the unpermute for the other), so the compute chain's gap is at least the
    all-to-alls' priced time; with EP overlap the gaps are not taken (the nodes of two micro-batches
    interleave), and the bound is then the busy time alone."""
    base = {**MOE, "parallel.ep": 4, "parallel.gpus": 4, "parallel.tp": 1, "parallel.global_batch": 8,
            "run.cuda_graphs": True, "model.layers": 2}
    plain = resolved(base)
    costs = BlockCosts(plain)
    a2a = sum(s for x, s in costs.busy[0].items() if x == "ep_comm")
    assert costs.gap[0]["compute"] >= 0.5 * a2a > 0  # negative control: no gaps would make this 0
    step = simulate(plain).step_time_s
    assert cheap_bound(plain).step_s <= step and lower_bound(plain).step_s <= step
    busy_only = plain.micro_batches * costs.busy[0]["compute"]
    assert cheap_bound(plain).step_s > busy_only  # the gaps tighten the cheap level
    overlapped = resolved({**base, "parallel.moe_ep_overlap": True})
    assert overlapped is not None and BlockCosts(overlapped).gap[0] == {}


def test_print_the_kinds_generated():
    """Not a check: how many scenarios of each kind resolved (run with -s to see it)."""
    print("\nbound test, scenarios per kind:", seen)


pipelines = st.fixed_dictionaries({
    "pp": st.sampled_from([2, 3, 4]),
    "vp": st.sampled_from([1, 2]),
    "layers_per_chunk": st.sampled_from([1, 2]),
    "tp": st.sampled_from([1, 2]),
    "dp": st.sampled_from([1, 2]),
    "micro_batches": st.integers(1, 10),
    "group": st.sampled_from([None, None, 5]),
    "recompute": st.sampled_from(["none", "full"]),
    "dist_opt": st.booleans(),
    "dp_overlap": st.booleans(),
    "host": st.sampled_from([None, 100.0]),
    "split": st.booleans(),
    "moe": st.sampled_from([False, False, True]),
})


def _simulated_step(rs, overrides: dict, found: list | None = None) -> float:
    """simulate(rs)'s step. The engine deadlocks on some legal pipelines (reported, not the bound's): such an
    example is dropped, its overrides kept in `found` when given."""
    try:
        return simulate(rs).step_time_s
    except ValueError as err:
        assert "deadlock" in str(err)
        if found is not None:
            found.append(overrides)
        assume(False)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(p=pipelines)
def test_fill_and_drain_keep_the_bound_below_the_step_of_generated_pipelines(p):
    """Steps 7-8 (sim/search/pipeline_bound.py) where they bite: 1F1B and interleaved pipelines, a few
    micro-batches or many (short schedule or full), group sizes, the embedding and loss in the split."""
    pp, vp, tp, dp = p["pp"], p["vp"], p["tp"], p["dp"]
    layers = pp * vp * p["layers_per_chunk"] - (2 if p["split"] else 0)
    o = {"parallel.pp": pp, "parallel.vp": vp, "parallel.tp": tp, "parallel.sp": tp > 1, "parallel.gpus": tp * pp * dp,
         "topology.nodes": 2, "parallel.dp": "auto", "parallel.micro_batch": 1, "model.layers": layers,
         "parallel.global_batch": dp * p["micro_batches"], "parallel.recompute": p["recompute"],
         "parallel.distributed_optimizer": p["dist_opt"], "parallel.dp_overlap": p["dp_overlap"],
         "parallel.p2p_overlap": vp == 1 or pp > 2, "parallel.microbatch_group_size": p["group"],
         "parallel.account_for_embedding_in_split": p["split"], "parallel.account_for_loss_in_split": p["split"],
         **({"hardware.compute.host_dispatch_us": p["host"]} if p["host"] else {"run.cuda_graphs": True}),
         **(MOE | {"parallel.ep": 2} if p["moe"] else {})}
    rs = resolved(o)
    assume(rs is not None and layers > 0)
    step = _simulated_step(rs, o, deadlocks)
    cheap, bound = cheap_bound(rs), lower_bound(rs)
    assert 0 < cheap.step_s <= step, ("cheap", o, cheap.step_s, step)
    assert 0 < bound.step_s <= step, ("refined", o, bound.step_s, step)


deadlocks: list[dict] = []


def test_print_the_pipelines_the_engine_deadlocks_on():
    """Not a check: legal scenarios the engine deadlocks on (run with -s to see them)."""
    print("\nengine deadlocks:", deadlocks[:3], len(deadlocks))


combined = st.fixed_dictionaries({
    "pp": st.sampled_from([1, 1, 2, 3, 4]),
    "vp": st.sampled_from([1, 2]),
    "layers_per_chunk": st.sampled_from([1, 2]),
    "tp": st.sampled_from([1, 2]),
    "tp_comm_overlap": st.booleans(),
    "ep": st.sampled_from([1, 2, 4]),
    "dispatcher": st.sampled_from(["alltoall", "allgather", "flex"]),
    "ep_overlap": st.sampled_from([True, True, False]),
    "delay_wgrad": st.booleans(),
    "micro_batches": st.integers(1, 10),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "experts": st.sampled_from([4, 8]),
    "hidden": st.sampled_from([256, 1024]),
    "seq": st.sampled_from([128, 512]),
    "host": st.sampled_from([None, None, 100.0]),
    "split": st.booleans(),
})


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(p=combined)
def test_combined_windows_keep_the_bound_below_the_step(p):
    """cheap_bound.py step 6 / bound.py step 10 (sim/search/overlap_windows.py) where they bite: MoE with EP
    overlap on and off, ep 1 to 4, the three dispatchers, deferred weight gradients, with and without
    pipelining (1F1B and interleaved, few and many micro-batches), dense layers first in the split."""
    pp, vp, tp, ep = p["pp"], p["vp"] if p["pp"] > 1 else 1, p["tp"], p["ep"]
    dispatcher, recompute = p["dispatcher"], p["recompute"]
    if p["ep_overlap"]:  # what Megatron's overlap needs (scenarios/moe_checks.py check_ep_overlap)
        ep, vp = max(ep, 2), 2 if pp > 1 else 1
        dispatcher = "alltoall" if dispatcher == "allgather" else dispatcher
        recompute = "selective" if recompute == "full" else recompute
    layers = pp * vp * p["layers_per_chunk"] - (2 if p["split"] and pp > 1 else 0)
    o = {**MOE, "model.moe": {"experts": p["experts"], "top_k": 2, "ffn_hidden": 512},
         "model.layers": layers, "model.hidden": p["hidden"], "model.seq_len": p["seq"],
         "parallel.pp": pp, "parallel.vp": vp, "parallel.tp": tp, "parallel.sp": tp > 1,
         "parallel.tp_comm_overlap": p["tp_comm_overlap"] and tp > 1, "parallel.ep": ep,
         "parallel.gpus": tp * pp * max(1, ep // tp) * 1, "topology.nodes": 2, "parallel.dp": "auto",
         "parallel.micro_batch": 1, "parallel.moe_dispatcher": dispatcher,
         "parallel.moe_ep_overlap": p["ep_overlap"], "parallel.delay_wgrad_compute": p["delay_wgrad"] and p["ep_overlap"],
         "parallel.recompute": recompute, "parallel.p2p_overlap": vp == 1 or pp > 2,
         "parallel.account_for_embedding_in_split": p["split"] and pp > 1,
         "parallel.account_for_loss_in_split": p["split"] and pp > 1,
         **({"hardware.compute.host_dispatch_us": p["host"]} if p["host"] else {"run.cuda_graphs": True})}
    dp = o["parallel.gpus"] // (tp * pp)
    o["parallel.global_batch"] = dp * p["micro_batches"]
    rs = resolved(o)
    assume(rs is not None and layers > 0)
    step = _simulated_step(rs, o)
    cheap, bound = cheap_bound(rs), lower_bound(rs)
    combined_seen.append(any(BlockCosts(rs).excess))
    assert 0 < cheap.step_s <= step, ("cheap", o, cheap.step_s, step)
    assert 0 < bound.step_s <= step, ("refined", o, bound.step_s, step)


combined_seen: list[bool] = []


def test_combined_windows_hold_what_the_overlap_cannot_hide():
    """Negative control for step 6 / 10: under EP overlap with a slow all-to-all (two nodes, EP over
    InfiniBand), each combined step's forward waits for its own dispatch before its expert GEMMs, so the
    windows' excess on compute is positive and the bound rises above the busier stream's busy time; without
    EP overlap there are no windows (the gaps hold that case)."""
    base = {**MOE, "parallel.ep": 16, "parallel.gpus": 16, "topology.nodes": 2, "parallel.tp": 1,
            "parallel.global_batch": 16 * 6, "run.cuda_graphs": True, "model.layers": 2, "model.hidden": 1024,
            "model.seq_len": 512, "model.moe": {"experts": 16, "top_k": 4, "ffn_hidden": 512}}
    on = resolved({**base, "parallel.moe_ep_overlap": True})
    costs = BlockCosts(on)
    assert costs.excess[0]["compute"][0] > 0
    busy_only = on.micro_batches * max(costs.busy[0].values())
    step = simulate(on).step_time_s
    assert busy_only < cheap_bound(on).step_s <= step
    assert lower_bound(on).step_s <= step
    assert BlockCosts(resolved(base)).excess == [{}]


def test_print_the_combined_cases():
    """Not a check: generated combined cases that resolved, and how many had windows (run with -s)."""
    print("\ncombined windows: cases", len(combined_seen), "with windows", sum(combined_seen))


def test_an_interleaved_short_schedule_at_pp_2_is_one_megatron_accepts():
    """bound.py step 5's m' at pp 2, vp 2: 3 micro-batches is refused (3 mod 2 = 1 < pp), so the bound
    takes 4, whose schedule has every dependency: the fill-and-drain term (step 7) applies; with a group
    size of 5 it takes 5."""
    o = {"parallel.pp": 2, "parallel.vp": 2, "model.layers": 4, "parallel.gpus": 2, "parallel.tp": 1,
         "parallel.global_batch": 2 * 8, "run.cuda_graphs": True, "parallel.p2p_overlap": False}
    rs = resolved(o)
    assert rs.micro_batches == 8 and short_micro_batches(rs) == 4
    schedules = build_stage_schedules(replace(rs, micro_batches=4))
    pipe = Pipeline(schedules, lambda op, stage: Pricer(rs)(op, stage * rs.stage_size))
    assert pipe.ok and max(pipe.fill_drain(1, "compute")) > 0
    assert lower_bound(rs).step_s <= simulate(rs).step_time_s
    grouped = resolved({**o, "parallel.microbatch_group_size": 5, "parallel.global_batch": 2 * 10})
    assert grouped is not None and short_micro_batches(grouped) == 5
