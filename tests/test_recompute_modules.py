"""Selective recompute by module (Megatron --recompute-modules): the activation bytes each one drops, by
hand, the ops each one re-runs in backward, with the default list (core_attn) as the negative control."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.schedule.builder import build_schedule

# tiny-2gpu as a DeepSeek-like model: MLA, one dense layer then one MoE layer, tp 2 + SP
MLA_MOE = {
    "model.mla": {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
    "model.moe": {"experts": 4, "top_k": 2, "ffn_hidden": 128, "dense_layers": 1},
    "model.bias": False, "model.mlp": "swiglu", "parallel.tp": 2, "parallel.sp": True,
    "parallel.recompute": "selective",
}


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, {**MLA_MOE, **overrides}, source), source)


def recompute_ops(rs) -> set[str]:
    return {op.name.split(".", 2)[2] for op in build_schedule(rs).ops if op.phase == "recompute"}


def acts(rs) -> float:
    return memory_per_gpu(rs).activations_gb * 1e9


def test_default_module_list_recomputes_the_core_only():
    assert recompute_ops(tiny({})) == {"recompute.attn"}
    assert recompute_ops(tiny({"parallel.recompute_modules": []})) == set()


def test_mla_up_proj_drops_q_k_v_and_reruns_the_up_projections():
    base, up = tiny({"parallel.recompute_modules": []}), tiny({"parallel.recompute_modules": ["mla_up_proj"]})
    m = base.scenario.model
    heads, a = m.heads // 2, m.mla  # this rank's heads (tp 2)
    tokens = m.seq_len * base.scenario.parallel.micro_batch
    qkv = tokens * 2 * heads * (2 * (a.qk_head_dim + a.qk_rope_head_dim) + a.v_head_dim)
    assert acts(base) - acts(up) == pytest.approx(m.layers * qkv)
    # the SP gathers of both latents and of the rotary key, both up GEMMs, RoPE
    assert recompute_ops(up) == {"recompute.q_up", "recompute.kv_up", "recompute.rope", "recompute.attn_in_q",
                                 "recompute.attn_in_kv", "recompute.attn_in_rope"}


def test_mlp_drops_the_dense_layers_mlp_outputs_and_reruns_it():
    base, mlp = tiny({"parallel.recompute_modules": []}), tiny({"parallel.recompute_modules": ["mlp"]})
    m = base.scenario.model
    tokens, ffn = m.seq_len * base.scenario.parallel.micro_batch, m.ffn // 2
    dense = tokens * (2 * 2 * ffn + 2 * ffn)  # swiglu: gate + up output, activation output (one dense layer)
    assert acts(base) - acts(mlp) == pytest.approx(dense)
    assert {"recompute.fc1", "recompute.fc2", "recompute.act"} <= recompute_ops(mlp)
    assert not any("expert" in n for n in recompute_ops(mlp))


def test_moe_act_drops_the_experts_activation_output():
    base, act = tiny({"parallel.recompute_modules": []}), tiny({"parallel.recompute_modules": ["moe_act"]})
    m = base.scenario.model
    # ep 1: every row this rank routes is local; under SP it routes its sequence shard (tp 2)
    rows = m.seq_len * base.scenario.parallel.micro_batch // 2 * m.moe.top_k
    assert acts(base) - acts(act) == pytest.approx(rows * 2 * m.moe.ffn_hidden)
    assert recompute_ops(act) == {"recompute.expert_act"}


def test_layernorm_drops_the_separate_norms_outputs_and_reruns_them():
    """MLA's input norm (every layer) and the MoE layer's pre-MLP norm are their own modules: their outputs,
    2h per token of the sequence shard (SP, tp 2), are not kept, and each norm runs again as its block's
    backward starts. A dense MHA model's norms are fused into their linears (IdentityOp in Megatron): the
    module changes nothing there (negative control)."""
    base, ln = tiny({"parallel.recompute_modules": []}), tiny({"parallel.recompute_modules": ["layernorm"]})
    m = base.scenario.model
    shard = m.seq_len * base.scenario.parallel.micro_batch // 2
    norms = m.layers + 1  # ln1 of both (MLA) layers, ln2 of the MoE layer
    assert acts(base) - acts(ln) == pytest.approx(norms * shard * 2 * m.hidden)
    assert recompute_ops(ln) == {"recompute.ln1", "recompute.ln2"}
    ops = {op.name: op for op in build_schedule(ln).ops}
    assert len([n for n in ops if n.endswith("mb0.recompute.ln1")]) == m.layers
    assert [n for n in ops if n.endswith("mb0.recompute.ln2")] == ["L1.mb0.recompute.ln2"]  # the MoE layer only
    dense = {"model.mla": None, "model.moe": None}
    plain, plain_ln = tiny({**dense, "parallel.recompute_modules": []}), tiny(
        {**dense, "parallel.recompute_modules": ["layernorm"]})
    assert acts(plain) == acts(plain_ln) and recompute_ops(plain_ln) == set()


@pytest.mark.parametrize("overrides,words", [
    ({"parallel.recompute": "full", "parallel.recompute_modules": ["mlp"]}, "selective"),
    ({"model.mla": None, "parallel.recompute_modules": ["mla_up_proj"]}, "mla_up_proj"),
])
def test_recompute_module_rules(overrides, words):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert err.value.field == "parallel.recompute_modules" and words in str(err.value)
