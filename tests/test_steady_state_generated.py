"""Differential test of the steady-state proof (sim/results/steady_state.py) on generated tiny scenarios: the
default run equals `--full` to 1e-9 of the step (step, breakdown, critical path segment by segment), or
it reports that it simulated the whole step and gives the same result. The generator aims at what can
break a period: hosts whose dispatch time per period is within 15% of the GPU's time for it (faster and
slower), 1F1B and interleaved pipelines, uneven stages, DP overlap and parameter gathers, FSDP, TP comm overlap,
compute/communication interference. `fallbacks` counts how often the proof refused (printed with -s)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_steady_state import assert_same_step, resolved

from meshsim.sim.results import simulate as sim_glue
from meshsim.sim.results.simulate import simulate

fallbacks: Counter = Counter()


def gpu_period(overrides: dict) -> tuple[float, int]:
    """(T, P): the GPU's time per period with no host limit (CUDA graphs) and stage 0's ops per period,
    from the plan's run."""
    rs = resolved("tiny-2gpu", {**overrides, "run.cuda_graphs": True}, 48)
    plan = sim_glue.steady_plan(rs)
    n_b = plan.lead + 2 * plan.unit + plan.tail
    run = sim_glue._short_run(replace(rs, micro_batches=n_b), n_b, False, sim_glue.CollectiveCoster(rs), None)
    ops = run.schedules[0].ops
    first = [next(op.id for op in ops if op.micro_batch == mb) for mb in (plan.lead, plan.lead + plan.unit)]
    events = run.log.by_rank()[run.log.ranks[0]]
    return events[first[1]].start_s - events[first[0]].start_s, first[1] - first[0]


def host(overrides: dict, mode: str, delta: float) -> dict:
    """The host setting: CUDA graphs, the default dispatch time, or one whose period is (1 + delta) x the
    GPU's (host-bound when delta > 0, a host barely ahead when delta < 0)."""
    if mode == "graphs":
        return {"run.cuda_graphs": True}
    if mode == "default":
        return {}
    period_s, ops = gpu_period(overrides)
    return {"hardware.compute.host_dispatch_us": period_s * (1 + delta) / ops * 1e6}


def check(overrides: dict, micro_batches_over: int, long: bool = False) -> None:
    """Default vs --full with the fewest micro-batches the default extrapolates at, plus some periods;
    `long`: enough for the default's second try with later cuts (sim/results/simulate.py later_plan)."""
    plan = sim_glue.steady_plan(resolved("tiny-2gpu", overrides, 48))  # 48: any interleaving's group size
    n_b = plan.lead + 2 * plan.unit + plan.tail
    if long:
        n_b = 2 * sim_glue.later_plan(plan).run_length(10**6, force=True)
    periods = -(-max(plan.unit, n_b // 4) // plan.unit) + micro_batches_over  # enough to extrapolate by default
    m = n_b + periods * plan.unit
    rs = resolved("tiny-2gpu", overrides, m)
    result, full = simulate(rs), simulate(rs, full=True)
    state = result.steady_state
    if state.path == "extrapolated":
        fallbacks["extrapolated"] += 1
        assert_same_step(result, full)
    else:
        fallbacks[state.reason.split(":")[-1].split(" (")[0][:40]] += 1
        assert state.reason != "requested (--full)"
        assert replace(result, steady_state=None) == replace(full, steady_state=None)


HOST = st.tuples(st.sampled_from(["graphs", "default", "bound", "bound"]), st.floats(-0.15, 0.15))

no_pp = st.fixed_dictionaries({
    "model.layers": st.integers(1, 3),
    "model.hidden": st.sampled_from([256, 1024]),
    "model.seq_len": st.sampled_from([128, 512]),
    "parallel.tp": st.sampled_from([1, 2, 4]),
    "parallel.sp": st.booleans(),
    "parallel.micro_batch": st.sampled_from([1, 2]),
    "parallel.tp_comm_overlap": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallel.distributed_optimizer": st.booleans(),
    "parallel.dp_overlap": st.booleans(),
    "parallel.overlap_param_gather": st.sampled_from([None, True, False]),
    "parallel.gpus": st.sampled_from([4, 8, 16]),
    "topology.nodes": st.just(2),
    "hardware.compute.comm_interference": st.sampled_from([0.0, 0.0, 0.3]),
    "model.mtp_layers": st.sampled_from([0, 0, 0, 1]),  # multi-token prediction rides with the head
    "parallel.fsdp": st.sampled_from([False, False, False, True]),  # gathers that cross micro-batches
    "parallel.dist_opt_instances": st.sampled_from([1, 1, 1, 2]),  # reduce-scatter, then across instances
})


def _no_pp(overrides: dict, host_mode: tuple) -> dict:
    o = dict(overrides)
    o.update({"parallel.sp": o["parallel.sp"] and o["parallel.tp"] > 1, "parallel.dp": "auto"})
    o["parallel.tp_comm_overlap"] = o["parallel.tp_comm_overlap"] and o["parallel.sp"]  # Megatron asserts SP
    if o["parallel.fsdp"]:
        o["parallel.distributed_optimizer"] = True  # Megatron-FSDP runs the distributed optimizer
    if o["parallel.gpus"] // o["parallel.tp"] % 2:
        o["parallel.dist_opt_instances"] = 1  # dp must split in two (with FSDP: hybrid sharding)
    if o["parallel.dist_opt_instances"] > 1:
        o["parallel.distributed_optimizer"] = True  # the instances cut the distributed optimizer's shards
    if not (o["parallel.distributed_optimizer"] and o["parallel.dp_overlap"]):
        o["parallel.overlap_param_gather"] = None  # Megatron: needs both
    return {**o, **host(o, *host_mode)}


@settings(max_examples=160, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=no_pp, host_mode=HOST, extra=st.integers(0, 2))
def test_default_equals_full_on_generated_scenarios_without_pipelines(overrides, host_mode, extra):
    check(_no_pp(overrides, host_mode), extra)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=no_pp, host_mode=HOST)
def test_default_equals_full_on_generated_longer_steps(overrides, host_mode):
    """Steps long enough for the second try, with the cuts later (the host settled, the gathers done)."""
    check(_no_pp(overrides, host_mode), 0, long=True)


pipelined = st.fixed_dictionaries({
    "parallel.pp": st.sampled_from([2, 3, 4]),
    "parallel.vp": st.sampled_from([1, 1, 2]),
    "layers_per_chunk": st.sampled_from([1, 1, 1, 2]),
    "uneven": st.booleans(),
    "model.hidden": st.sampled_from([256, 1024]),
    "model.seq_len": st.sampled_from([128, 512]),
    "parallel.tp": st.sampled_from([1, 2]),
    "parallel.sp": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective", "full"]),
    "parallel.distributed_optimizer": st.booleans(),
    "parallel.dp_overlap": st.booleans(),
    "parallel.p2p_overlap": st.booleans(),
    "parallel.tp_comm_overlap": st.booleans(),
    "dp": st.sampled_from([1, 2]),
    "hardware.compute.comm_interference": st.sampled_from([0.0, 0.0, 0.3]),
    "model.mtp_layers": st.sampled_from([0, 0, 0, 1]),  # multi-token prediction rides with the head
})


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=pipelined, host_mode=HOST, extra=st.integers(0, 1))
def test_default_equals_full_on_generated_pipelines(overrides, host_mode, extra):
    o = dict(overrides)
    extra = extra if o["parallel.vp"] == 1 else 0  # interleaved periods are N micro-batches: one is plenty
    if o["parallel.vp"] > 1:
        o["parallel.pp"] = min(o["parallel.pp"], 3)  # interleaved: small enough for CI
    pp, vp, tp, dp, uneven = o["parallel.pp"], o["parallel.vp"], o["parallel.tp"], o.pop("dp"), o.pop("uneven")
    layers = pp * vp * o.pop("layers_per_chunk")
    if vp > 1 and pp < 3:
        o["parallel.p2p_overlap"] = False  # interleaving with 2 stages needs blocking P2P (Megatron's rule)
    if uneven and vp == 1 and pp > 2:  # one layer on the first stage, the rest spread evenly
        layers = 1 + (pp - 1) * 2
        o.update({"parallel.first_stage_layers": 1, "parallel.last_stage_layers": 2})
    o.update({"model.layers": layers, "parallel.gpus": tp * pp * dp, "parallel.dp": "auto",
              "parallel.sp": o["parallel.sp"] and tp > 1, "topology.nodes": 4, "parallel.micro_batch": 1})
    o["parallel.tp_comm_overlap"] = o["parallel.tp_comm_overlap"] and o["parallel.sp"]  # Megatron asserts SP
    o.update(host(o, *host_mode))
    check(o, extra)


def test_print_how_often_the_proof_refused():
    """Not a check: the tally of the two tests above (run with -s to see it)."""
    print("\nsteady-state outcomes on the generated scenarios:", dict(fallbacks.most_common()))
