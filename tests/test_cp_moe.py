"""Context parallelism with MoE layers, as Megatron-Core folds them (parallel_state.py L859-895 @d98e8a64):
attention on tp-cp-dp-pp, experts on etp-ep-edp-pp over the same ranks. Each rank routes its s / cp tokens
(closed form), the expert groups are Megatron's RankGenerator's with cp folded in, the mesh is symmetric
(explicit ranks give the representative's step), the default run equals --full, and memory and dispatch
bytes scale as 1 / cp. Negative controls: MLA and sliding windows with cp stay refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.core.mesh import mesh_group
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.results.simulate import simulate, simulate_steady
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.moe_shapes import moe_dims
from meshsim.sim.schedule.ops import Collective
from tests.test_moe_config import expert_reference
from tests.test_steady_state import assert_same_step, resolved
from tests.test_steady_state_generated import HOST, check, host

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def tiny(cp: int, **extra):
    """tiny-2gpu (seq 128, micro-batch 2) as an MoE model on 8 GPUs: tp 2 + SP, cp `cp`, ep 4."""
    scenario, source = load_scenario("tiny-2gpu")
    over = {"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": True, "parallel.cp": cp, "parallel.ep": 4,
            "parallel.global_batch": 8, **MOE, **extra}
    return resolve(with_overrides(scenario, over, source), source)


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_each_rank_routes_its_cp_share_of_the_tokens(cp):
    """T = s b / (cp tp) = 128 x 2 / (cp x 2); the dispatch all-to-all sends T k rows of h bf16 elements."""
    rs = tiny(cp)
    dims = moe_dims(rs)
    assert dims.tokens == 128 * 2 // (cp * 2)
    hidden = rs.scenario.model.hidden
    dispatch = [op.work for op in build_schedule(rs).ops if op.name == "L0.mb0.fwd.dispatch"]
    assert [w.nbytes for w in dispatch] == [dims.tokens * 2 * hidden * 2]
    assert dispatch[0].group == "ep" and rs.group("ep", 0) == (0, 1, 2, 3)


@pytest.mark.parametrize("tp,dp,cp,ep,etp", [(1, 4, 2, 8, 1), (2, 2, 2, 4, 1), (2, 2, 2, 4, 2), (2, 1, 4, 8, 1),
                                             (1, 2, 4, 2, 2)])
def test_the_expert_mesh_folds_cp_in_as_megatron_does(tp, dp, cp, ep, etp):
    """Megatron's expert generator runs over the stage's tp cp dp contiguous ranks with cp = 1: the same
    groups as a mesh of dp' = cp dp replicas; the attention cp group is tp apart (tp-cp-dp order)."""
    for kind, rank in itertools.product(("etp", "ep", "etp_ep", "edp"), range(2 * tp * cp * dp)):
        assert mesh_group(kind, rank, tp, dp, pp=2, ep=ep, etp=etp, cp=cp) == \
            expert_reference(kind, rank, tp, cp * dp, ep, etp)
    assert mesh_group("cp", 0, tp, dp, pp=2, cp=cp) == tuple(range(0, tp * cp, tp))


def test_the_step_is_symmetric_and_extrapolates_exactly():
    """Explicit ranks (one tp group x 2 replicas, real rendezvous) give the representative rank's step;
    the default (extrapolated) run equals --full."""
    rs = tiny(2)
    assert simulate(rs, explicit_ranks=True, full=True).step_time_s == \
        pytest.approx(simulate(rs, full=True).step_time_s, rel=1e-12)
    rs = resolved("tiny-2gpu", {"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": True, "parallel.cp": 2,
                                "parallel.ep": 4, **MOE})
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    assert_same_step(ex, simulate(rs, full=True))


def test_cp_halves_the_moe_activations_and_keeps_the_expert_states():
    """Mixtral 8x7B on one DGX H100 (ep 8), cp 2 against cp 1 at the same GPUs: every layer holds half the
    tokens, so activations halve; experts stay sharded over ep 8 (weights and grads unchanged) and dense
    gradients reduce over dp x cp = 8 either way."""
    scenario, source = load_scenario("mixtral-8x7b-h100-ep8")
    mem = {cp: memory_per_gpu(resolve(with_overrides(scenario, {"parallel.cp": cp}, source), source))
           for cp in (1, 2)}
    assert mem[2].activations_gb == pytest.approx(mem[1].activations_gb / 2, rel=0.02)
    assert (mem[2].weights_gb, mem[2].grads_gb) == (mem[1].weights_gb, mem[1].grads_gb)
    rs = resolve(with_overrides(scenario, {"parallel.cp": 2}, source), source)
    assert (rs.dp, rs.grad_dp, rs.edp) == (4, 8, 1)
    groups = {op.work.group for op in build_schedule(rs).ops if isinstance(op.work, Collective)}
    assert {"cp", "ep"} <= groups


@pytest.mark.parametrize("cp_comm, why", [("p2p", "fused attention refuses sliding windows"),
                                          ("allgather", "does not model the allgather chunks")])
def test_cp_with_sliding_windows_needs_a2a(cp_comm, why):
    with pytest.raises(UserError) as err:
        tiny(2, **{"model.sliding_window": 32, "parallel.cp_comm": cp_comm})
    assert err.value.field == "parallel.cp_comm" and why in str(err.value) and "cp_comm: a2a" in str(err.value)


def test_a2a_runs_the_window_over_the_whole_sequence():
    """cp 2 with a2a: after the all-to-all each rank attends the whole sequence (128 tokens x b 2) on
    heads / (tp cp) = 1 head with the window; its FLOPs are the windowed count, s w - w (w - 1) / 2 pairs,
    half the heads of the same layer without CP. GPT-OSS's alternating layers: the unwindowed one is causal."""
    over = {"model.sliding_window": 32, "model.sliding_window_skip_every": 2, "parallel.cp_comm": "a2a"}
    rs, flat = tiny(2, **over), tiny(1, **over)
    by_layer = {}
    for r in (rs, flat):
        for op in build_schedule(r).ops:
            if op.micro_batch == 0 and op.phase == "fwd" and op.name.endswith(".attn"):
                by_layer.setdefault(op.layer, []).append(op.work)
    for (cp_work, flat_work) in by_layer.values():
        assert (cp_work.seq, cp_work.heads, cp_work.window) == (128, flat_work.heads // 2, flat_work.window)
        assert cp_work.flops == pytest.approx(flat_work.flops / 2)
    windows = [works[0].window for works in by_layer.values()]
    assert 32 in windows and None in windows
    pairs = 128 * 32 - 32 * 31 / 2
    windowed = next(works[0] for works in by_layer.values() if works[0].window)
    assert windowed.flops == pytest.approx(2 * 2 * windowed.head_dim * 2 * pairs * windowed.heads)
    rs = resolved("tiny-2gpu", {"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": True, "parallel.cp": 2,
                                "parallel.ep": 4, **MOE, **over})
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    assert_same_step(ex, simulate(rs, full=True))


# ----- MLA under CP: Q and K are qk + rope wide, V and the output v wide (cp_ops.Widths) -------------------
MLA = {"model.mla": {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_head_dim": 32, "qk_rope_head_dim": 16,
                     "v_head_dim": 24}}
QK, V = 32 + 16, 24


def _works(rs, part: str, phase: str = "fwd") -> list:
    return [op.work for op in build_schedule(rs).ops if op.micro_batch == 0 and op.layer == 0
            and op.phase == phase and part in op.name]


@pytest.mark.parametrize("cp_comm", ["p2p", "a2a", "allgather"])
def test_mla_under_cp_moves_both_head_widths(cp_comm):
    """Per rank: T = s b / (cp tp) local tokens of h = heads / tp heads (tp 2, cp 2: 64 x 2 tokens, 2 heads).
    p2p: one ring shift of K and V, T h (qk + v) x 2 B; a2a: Q and K at qk, V and the output at v (over T
    local tokens, before the heads split); allgather: K and V gathered over cp at their own widths."""
    rs = tiny(2, **MLA, **{"parallel.cp_comm": cp_comm})
    tokens, heads = 128 // 2 * 2, 4 // 2  # seq / cp x micro-batch, heads / tp
    unit = tokens * heads * 2  # bytes per unit of head width
    if cp_comm == "p2p":
        assert [w.nbytes for w in _works(rs, "cp_ring")] == [unit * (QK + V)]
    elif cp_comm == "a2a":
        ops = [op for op in build_schedule(rs).ops if op.micro_batch == 0 and op.layer == 0 and op.phase == "fwd"
               and isinstance(op.work, Collective) and op.work.group == "cp_a2a"]
        assert {op.name.rsplit("_", 1)[-1]: op.work.nbytes for op in ops} == \
            {"q": unit * QK, "k": unit * QK, "v": unit * V, "out": unit * V}
    else:
        assert sorted(w.nbytes for w in _works(rs, "cp_gather")) == sorted([2 * unit * QK, 2 * unit * V])
        assert sorted(w.nbytes for w in _works(rs, "cp_scatter", "bwd")) == sorted([2 * unit * QK, 2 * unit * V])
    attns = [w for w in _works(rs, "attn") if hasattr(w, "v_head_dim")]
    assert attns and all((w.head_dim, w.v_head_dim) == (QK, V) for w in attns)


def test_standard_attention_under_cp_keeps_one_width():
    """The negative control: without MLA, K and V are head_dim wide and no Attention carries a V width."""
    rs = tiny(2)
    head_dim = rs.scenario.model.hidden // rs.scenario.model.heads
    tokens, kv_heads = 128 // 2 * 2, max(1, rs.scenario.model.num_kv_heads // 2)
    assert [w.nbytes for w in _works(rs, "cp_ring")] == [2 * tokens * kv_heads * head_dim * 2]
    assert all(w.v_head_dim is None for w in _works(rs, "attn") if hasattr(w, "v_head_dim"))


def test_mla_moe_under_cp_is_symmetric_and_extrapolates_exactly():
    rs = tiny(2, **MLA)
    assert simulate(rs, explicit_ranks=True, full=True).step_time_s == \
        pytest.approx(simulate(rs, full=True).step_time_s, rel=1e-12)
    rs = resolved("tiny-2gpu", {"parallel.gpus": 8, "parallel.tp": 2, "parallel.sp": True, "parallel.cp": 2,
                                "parallel.ep": 4, "parallel.recompute": "selective",
                                "parallel.recompute_modules": ["mla_up_proj", "core_attn"], **MOE, **MLA})
    ex, why = simulate_steady(rs, force=True)
    assert ex is not None, why
    assert_same_step(ex, simulate(rs, full=True))


moe_cp = st.fixed_dictionaries({
    "parallel.tp": st.sampled_from([1, 2]),
    "parallel.cp": st.sampled_from([1, 2, 4]),
    "parallel.cp_comm": st.sampled_from(["p2p", "a2a", "allgather"]),
    "parallel.ep": st.sampled_from([2, 4, 8]),
    "parallel.moe_dispatcher": st.sampled_from(["alltoall", "alltoall", "flex"]),
    "parallel.moe_ep_overlap": st.booleans(),
    "parallel.recompute": st.sampled_from(["none", "selective"]),
    "parallel.dp_overlap": st.booleans(),
    "model.layers": st.integers(1, 2),
    "model.seq_len": st.sampled_from([128, 512]),
    "hardware.compute.comm_interference": st.sampled_from([0.0, 0.3]),
    "mla": st.booleans(),
})


@settings(max_examples=24, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(overrides=moe_cp, host_mode=HOST)
def test_default_equals_full_on_generated_moe_cp_scenarios(overrides, host_mode):
    """The steady-state differential test (tests/test_steady_state_generated.py) over MoE x CP layouts on
    16 GPUs of two DGX H100: tp, cp, cp_comm, ep (inside a node or across), dispatcher, EP overlap, MLA or
    standard attention, hosts."""
    o = {**overrides, **MOE, "parallel.gpus": 16, "topology.nodes": 2, "parallel.dp": "auto",
         "parallel.sp": overrides["parallel.tp"] > 1, "parallel.micro_batch": 1}
    if o.pop("mla"):
        o.update(MLA)
    if o["parallel.cp_comm"] == "a2a" and (4 // o["parallel.tp"]) % o["parallel.cp"]:
        o["parallel.cp_comm"] = "p2p"  # a2a splits this rank's 4 / tp heads over cp (TE's rule)
    if o["parallel.moe_ep_overlap"]:
        o["parallel.delay_wgrad_compute"] = True
    check({**o, **host(o, *host_mode)}, 0)
