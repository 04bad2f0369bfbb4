"""The MoE layer's ops, shapes, FLOPs and memory: closed-form numbers and exact op sequences."""

from __future__ import annotations

import copy
import itertools
import math
from fractions import Fraction

import pytest

from meshsim.scenarios.load import load_and_resolve, load_scenario, resolve, with_overrides
from meshsim.sim.cost.flops import megatron_flops_per_token, model_flops_per_step
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.moe_shapes import distinct_holders
from meshsim.sim.schedule.ops import Collective

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}, "model.bias": False, "model.mlp": "swiglu"}


def tiny(overrides: dict, gpus: int = 8):
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": gpus, "parallel.tp": 1, "parallel.global_batch": gpus, "parallel.micro_batch": 1,
            **copy.deepcopy(MOE)}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def layer_ops(rs, layer=1, phase="fwd"):
    return [op for op in build_schedule(rs).ops if op.layer == layer and op.micro_batch == 0 and op.phase == phase]


def names(ops):
    return [op.name.split(".", 3)[-1] for op in ops]


def test_alltoall_forward_is_megatrons_order():
    rs = tiny({"parallel.ep": 4})
    ops = layer_ops(rs)
    assert names(ops)[names(ops).index("ln2"):] == [
        "ln2", "router", "route", "dispatch_meta", "permute", "dispatch", "dispatch_probs", "sort_chunks",
        "expert_fc1", "expert_act", "expert_fc2", "unsort_chunks", "combine", "unpermute", "mlp_res"]
    by = {n: op for n, op in zip(names(ops), ops, strict=True)}
    t, k, h = 128, 2, 256  # seq 128 x micro-batch 1 tokens, top-2, hidden
    assert by["dispatch"].work == Collective("all_to_all", "ep", t * k * h * 2, "dispatch")
    assert by["dispatch"].stream == by["dispatch"].category == "ep_comm"
    # 2 local experts, each t k / 2 rows: [128, 1024 (gate + up of 512)] x [256]
    assert (by["expert_fc1"].work.m, by["expert_fc1"].work.n, by["expert_fc1"].work.k, by["expert_fc1"].work.batch) == \
        (128, 1024, 256, 2)


def test_backward_mirrors_forward_and_expert_grads_reduce_over_edp():
    rs = tiny({"parallel.ep": 4, "parallel.distributed_optimizer": True})
    bwd = names(layer_ops(rs, phase="bwd"))
    order = ["unpermute", "combine", "unsort_chunks", "expert_fc2_dgrad", "expert_fc2_wgrad", "expert_act",
             "expert_fc1_dgrad", "expert_fc1_wgrad", "sort_chunks", "dispatch_probs", "dispatch", "permute", "route",
             "router_dgrad", "router_wgrad", "moe_grad_add", "ln2"]
    assert [n for n in bwd if n in order] == order
    end = [op for op in build_schedule(rs).ops if op.name.startswith("dp.bucket")]
    groups = {op.work.group for op in end}
    assert groups == {"dp", "edp"}  # dense over dp 8, experts over edp 2
    edp_params = sum(op.work.nbytes for op in end if op.work.group == "edp" and op.work.op == "reduce_scatter") // 4
    assert edp_params == build_schedule(rs).meta["expert_params_per_rank"] == 2 * 2 * (256 * 1024 + 512 * 256)


def test_expert_tensor_parallel_and_other_dispatchers():
    rs = tiny({"parallel.ep": 2, "parallel.etp": 2})
    by = {n: op for n, op in zip(names(layer_ops(rs)), layer_ops(rs), strict=True)}
    rows = 128 * 2 * 2  # etp x T k
    assert by["expert_gather"].work.group == "etp" and by["expert_gather"].work.nbytes == rows * 256 * 2
    assert by["expert_gather_probs"].work == Collective("all_gather", "etp", rows * 4, "expert_gather")  # fp32
    bwd = {n: op for n, op in zip(names(layer_ops(rs, phase="bwd")), layer_ops(rs, phase="bwd"), strict=True)}
    assert (bwd["expert_gather"].work.op, bwd["expert_gather_probs"].work.op) == ("reduce_scatter",) * 2
    assert by["expert_scatter"].work.op == "reduce_scatter" and by["expert_fc1"].work.n == 2 * 512 // 2
    gather = tiny({"parallel.ep": 4, "parallel.moe_dispatcher": "allgather"})
    g = {n: op for n, op in zip(names(layer_ops(gather)), layer_ops(gather), strict=True)}
    assert g["moe_gather"].work.group == "etp_ep" and g["moe_gather"].work.nbytes == 4 * 128 * 256 * 2
    assert g["moe_scatter"].work.op == "reduce_scatter" and "dispatch" not in g
    flex = tiny({"parallel.ep": 4, "parallel.moe_dispatcher": "flex", "parallel.moe_flex_backend": "hybridep"})
    f = names(layer_ops(flex))
    assert "permute" not in f and "sort_chunks" not in f and "dispatch_meta" not in f
    disp = layer_ops(flex)[f.index("dispatch")].work
    # one row per destination rank: 4 ranks of 2 experts, top-2 of 8 -> 4 (1 - C(6,2)/C(8,2)) = 13/7 ranks
    assert disp.kernel == "hybridep" and disp.nbytes == math.ceil(128 * 4 * (1 - 15 / 28)) * 256 * 2


def test_dense_model_has_no_expert_stream():
    ops = build_schedule(load_and_resolve("tiny-2gpu")).ops
    assert not [op for op in ops if op.stream == "ep_comm"]


def brute_distinct(experts: int, holders: int, k: int, groups: int | None, picked: int | None) -> Fraction:
    """E[distinct holders] by enumeration: picked groups uniformly, then k experts uniformly among theirs."""
    per, total, count = experts // holders, Fraction(0), 0
    group_sets = list(itertools.combinations(range(groups), picked)) if groups else [None]
    size = experts // groups if groups else experts
    for gs in group_sets:
        pool = [e for e in range(experts) if gs is None or e // size in gs]
        for chosen in itertools.combinations(pool, k):
            total += len({e // per for e in chosen})
            count += 1
    return total / count


@pytest.mark.parametrize("experts,holders,k,groups,picked", [(8, 4, 2, None, None), (16, 4, 4, None, None),
                                                            (16, 8, 4, 4, 2), (16, 2, 4, 8, 2), (12, 3, 2, 6, 3)])
def test_distinct_holders_against_enumeration(experts, holders, k, groups, picked):
    from meshsim.scenarios.schema import MoeConfig
    moe = MoeConfig(experts=experts, top_k=k, ffn_hidden=8, router_groups=groups, router_group_topk=picked)
    assert distinct_holders(moe, holders) == pytest.approx(float(brute_distinct(experts, holders, k, groups, picked)))


def test_qwen3_flops_are_megatron_bridges_count():
    """Megatron-LM training.py num_floating_point_operations for Qwen3-30B-A3B, by hand: 6 x (MLP h f_e k 3 +
    attention h (q + 2 kv) + q h + core s q, x 48 layers, + logits h V)."""
    rs = load_and_resolve("qwen3-30b-a3b-h100-ep16")
    h, q, kv, s, v = 2048, 4096, 512, 4096, 151936
    per_layer = h * 768 * 8 * 3 + h * (q + 2 * kv) + q * h + s * q
    assert megatron_flops_per_token(rs) == 6 * (48 * per_layer + h * v)
    assert megatron_flops_per_token(rs) / 1e9 == pytest.approx(23.006, abs=1e-3)  # Bridge: 203e12 / 8826 = 23.0
    assert model_flops_per_step(rs) == 1024 * 4096 * megatron_flops_per_token(rs)


def test_expert_optimizer_states_shard_over_edp():
    """ep 8: one local expert per layer, states unsharded (edp 1); ep 4: two, states over edp 2 -> the same
    optimizer bytes, twice the expert weights."""
    one = memory_per_gpu(tiny({"parallel.ep": 8, "parallel.distributed_optimizer": True}))
    two = memory_per_gpu(tiny({"parallel.ep": 4, "parallel.distributed_optimizer": True}))
    expert = 256 * 1024 + 512 * 256  # one expert of one layer: fc1 (gate + up) and fc2
    assert (two.weights_gb - one.weights_gb) * 1e9 == pytest.approx(2 * expert * 2, rel=1e-9)  # 2 layers x bf16
    assert two.optimizer_gb == pytest.approx(one.optimizer_gb, rel=1e-12)


def test_gelu_experts_run_the_eager_activation_chain_and_swiglu_one_fused_kernel():
    """GELU experts: act, x * fp32 probs (an fp32 product), cast back; autograd's six conjugates (moe_act.py).
    SwiGLU: one fused kernel (the negative control)."""
    rs = tiny({"parallel.ep": 4, "model.mlp": "gelu"})
    rows, f, a, q = 128 * 2, 512, 2, 4  # T k rows on this rank (2 local experts), ffn, bf16, fp32
    n = rows * f
    fwd = {name: op.work for name, op in zip(names(layer_ops(rs)), layer_ops(rs), strict=True)}
    assert [(fwd[k].bytes_read, fwd[k].bytes_written) for k in ("expert_act", "expert_act_probs", "expert_act_cast")] \
        == [(n * a, n * a), (n * a + rows * q, n * q), (n * q, n * a)]
    bwd = [(nm, op.work) for nm, op in zip(names(layer_ops(rs, phase="bwd")), layer_ops(rs, phase="bwd"), strict=True)
           if nm.startswith("expert_act")]
    assert [nm for nm, _ in bwd] == ["expert_act_cast", "expert_act_probs", "expert_act_probs_cast",
                                     "expert_act_probs_grad", "expert_act_probs_sum", "expert_act"]
    assert sum(w.bytes_read + w.bytes_written for _, w in bwd) == n * (a + q + 2 * q + q + a + q + a + q + q + 3 * a) \
        + 2 * rows * q
    swiglu = [nm for nm in names(layer_ops(tiny({"parallel.ep": 4}))) if nm.startswith("expert_act")]
    assert swiglu == ["expert_act"]
