"""GPT-OSS's expert kernels that Megatron runs eagerly: the per-expert fc2 bias (sim/schedule/expert_bias.py)
and quick-GEGLU's clamp (sim/schedule/moe_act.py). Closed-form bytes, exact op sequences, the memory they
keep, and negative controls (no bias, SwiGLU's fused clamp, no clamp)."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.flops import megatron_flops_per_token
from meshsim.sim.cost.memory import memory_per_gpu
from meshsim.sim.schedule.expert_bias import fc2_bias_bytes
from meshsim.sim.schedule.moe_shapes import moe_dims
from tests.test_moe_schedule import layer_ops, names, tiny

BIAS_FWD = ["expert_fc2", "expert_fc2_bias_scale", "expert_fc2_bias_add", "expert_fc2_bias_cat",
            "expert_fc2_bias_cast", "unsort_chunks"]
BIAS_BWD = ["unsort_chunks", "expert_fc2_bias_cast_bwd", "expert_fc2_bias_dbias", "expert_fc2_bias_dprobs",
            "expert_fc2_bias_dx", "expert_fc2_bias_split_bwd", "expert_fc2_dgrad"]
GPT_OSS_ACT = {"model.mlp": "quick_geglu", "model.activation_clamp": 7.0}


def _span(seq: list[str], first: str, last: str) -> list[str]:
    return seq[seq.index(first):seq.index(last) + 1]


def test_fc2_bias_runs_megatrons_eager_kernels_in_order():
    fwd = names(layer_ops(tiny({"parallel.ep": 4, "model.bias": True})))
    assert _span(fwd, "expert_fc2", "unsort_chunks") == BIAS_FWD
    bwd = names(layer_ops(tiny({"parallel.ep": 4, "model.bias": True}), phase="bwd"))
    assert _span(bwd, "unsort_chunks", "expert_fc2_dgrad") == BIAS_BWD


def test_fc2_bias_bytes_are_the_closed_form():
    m = moe_dims(tiny({"parallel.ep": 4, "model.bias": True}))
    rows, h, e, a, q = 256, 256, 2, 2, 4  # T k = 128 x 2 rows, 2 local experts, bf16, fp32 probs
    n = rows * h
    assert (m.expert_rows, m.hidden, m.local_experts) == (rows, h, e)
    assert fc2_bias_bytes(m) == (n * (6 * q + 2 * a) + e * h * a + rows * q,
                                 n * (8 * q + 4 * a) + 2 * rows * q + e * h * (q + a))


def test_fc2_bias_launches_once_per_local_expert():
    ops = {n: op for n, op in zip(names(layer_ops(tiny({"parallel.ep": 2, "model.bias": True}))),
                                  layer_ops(tiny({"parallel.ep": 2, "model.bias": True})), strict=True)}
    assert ops["expert_fc2_bias_scale"].host_calls == 2 + 4  # two splits, then b * p per local expert
    assert ops["expert_fc2_bias_add"].host_calls == 4


def test_no_bias_no_bias_kernels():
    for phase in ("fwd", "bwd"):
        assert not [n for n in names(layer_ops(tiny({"parallel.ep": 4}), phase=phase)) if "bias" in n]
    assert fc2_bias_bytes(moe_dims(tiny({"parallel.ep": 4}))) == (0, 0)


def test_quick_geglu_clamp_runs_before_the_fused_kernel_and_after_its_backward():
    rs = tiny({"parallel.ep": 4, **GPT_OSS_ACT})
    fwd, bwd = names(layer_ops(rs)), names(layer_ops(rs, phase="bwd"))
    assert _span(fwd, "expert_fc1", "expert_fc2") == ["expert_fc1", "expert_act_clamp", "expert_act_clamp_cat",
                                                      "expert_act", "expert_fc2"]
    assert _span(bwd, "expert_fc2_wgrad", "expert_fc1_dgrad") == [
        "expert_fc2_wgrad", "expert_act", "expert_act_clamp", "expert_act_clamp_cat", "expert_fc1_dgrad"]
    by = {n: op for n, op in zip(fwd, layer_ops(rs), strict=True)}
    half = 256 * 512 * 2  # rows x ffn x bf16
    assert (by["expert_act_clamp"].work.bytes_read, by["expert_act_clamp"].work.bytes_written) == (2 * half, 2 * half)
    by_b = {n: op for n, op in zip(bwd, layer_ops(rs, phase="bwd"), strict=True)}
    assert (by_b["expert_act_clamp"].work.bytes_read, by_b["expert_act_clamp"].work.bytes_written) == \
        (4 * half, 2 * half)


def test_recompute_of_moe_act_runs_the_clamp_again():
    rs = tiny({"parallel.ep": 4, **GPT_OSS_ACT, "parallel.recompute": "selective",
               "parallel.recompute_modules": ["moe_act"]})
    rec = names(layer_ops(rs, phase="recompute"))
    assert rec == ["expert_act_clamp", "expert_act_clamp_cat", "expert_act"]


@pytest.mark.parametrize("overrides", [{"model.mlp": "swiglu", "model.activation_clamp": 7.0},
                                       {"model.mlp": "quick_geglu"}])
def test_fused_clamp_or_no_clamp_adds_no_kernel(overrides):
    rs = tiny({"parallel.ep": 4, **overrides})
    assert not [n for n in names(layer_ops(rs)) + names(layer_ops(rs, phase="bwd")) if "clamp" in n]


def test_clamp_keeps_the_clamped_copy_unless_moe_act_is_recomputed():
    rows, fc1_n = 256, 2 * 512
    plain = memory_per_gpu(tiny({"parallel.ep": 4, "model.mlp": "quick_geglu"}))
    clamped = memory_per_gpu(tiny({"parallel.ep": 4, **GPT_OSS_ACT}))
    layers, micro_batches_kept = 2, 1  # tiny-2gpu: 2 layers, no pipeline
    assert (clamped.activations_gb - plain.activations_gb) * 1e9 == \
        pytest.approx(rows * 2 * fc1_n * layers * micro_batches_kept, rel=1e-9)
    recompute = {"parallel.recompute": "selective", "parallel.recompute_modules": ["moe_act"]}
    assert memory_per_gpu(tiny({"parallel.ep": 4, **GPT_OSS_ACT, **recompute})).activations_gb == \
        memory_per_gpu(tiny({"parallel.ep": 4, "model.mlp": "quick_geglu", **recompute})).activations_gb


def test_quick_geglu_counts_like_megatron_without_swiglu():
    """Megatron's num_floating_point_operations keys the gated factor on --swiglu: quick-GEGLU counts 2."""
    swiglu, quick = tiny({"parallel.ep": 4}), tiny({"parallel.ep": 4, "model.mlp": "quick_geglu"})
    h, f, k, layers = 256, 512, 2, 2
    assert megatron_flops_per_token(swiglu) - megatron_flops_per_token(quick) == 6 * h * f * k * layers


@pytest.mark.parametrize(("overrides", "field"), [
    ({"model.mlp": "gelu", "model.activation_clamp": 7.0, "model.moe": None, "parallel.ep": 1},
     "model.activation_clamp"),
    ({"model.mlp": "quick_geglu", "model.moe": None, "parallel.ep": 1}, "model.mlp"),
    ({"model.mlp": "quick_geglu", "model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512,
                                                "shared_ffn_hidden": 512}}, "model.mlp"),
    ({"model.mlp": "quick_geglu", "model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512,
                                                "dense_layers": 1}}, "model.mlp")])
def test_unpriced_activations_are_refused_naming_the_field(overrides, field):
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": 8, "parallel.tp": 1, "parallel.global_batch": 8, "parallel.micro_batch": 1,
            "parallel.ep": 4, "model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}}
    with pytest.raises(UserError) as err:
        resolve(with_overrides(scenario, {**base, **overrides}, source), source)
    assert field in str(err.value)
