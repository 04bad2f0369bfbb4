"""model.qk_norm (Megatron --qk-layernorm: a norm over each query and key head, Qwen3 / OLMo 2 / Gemma 3): its
ops and bytes in closed form, where recompute re-runs them, its parameters and the TP sum of their
gradients, its activation memory, MLA's latent norms left alone, and validate's real run against the
single-process reference with a negative control."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.cost.memory import layer_activation_bytes
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.model_family import qk_norm_params
from meshsim.sim.schedule.shapes import layer_dims

# tiny-2gpu: hidden 256, 4 heads of 64, tp 2; with GQA 2 KV heads: per rank 2 query and 1 KV head
GQA = {"model.kv_heads": 2, "model.mlp": "swiglu", "model.bias": False}


def tiny(overrides: dict):
    scenario, source = load_scenario("tiny-2gpu")
    return resolve(with_overrides(scenario, copy.deepcopy(overrides), source), source)


def ops_named(schedule, suffix: str) -> list:
    return [op for op in schedule.ops if op.name.endswith(suffix)]


def test_each_layer_normalizes_its_query_and_key_heads_forward_and_backward():
    """Per layer and micro-batch: q_norm and k_norm after qkv, before the attention core, and their
    backward after the core's. Bytes: rows = tokens x local heads of head_dim 64, 16-bit, fp32 stats."""
    rs = tiny({**GQA, "model.qk_norm": True})
    sched = build_schedule(rs)
    tokens = 128 * 2  # seq x micro-batch
    q_rows, k_rows = tokens * 2, tokens * 1
    for key, rows in (("q_norm", q_rows), ("k_norm", k_rows)):
        fwd, bwd = ops_named(sched, f"L0.mb0.fwd.{key}"), ops_named(sched, f"L0.mb0.bwd.{key}")
        assert len(fwd) == len(bwd) == 1
        n = rows * 64 * 2
        assert (fwd[0].work.bytes_read, fwd[0].work.bytes_written) == (n, n + 8 * rows)
        assert (bwd[0].work.bytes_read, bwd[0].work.bytes_written) == (2 * n + 8 * rows, n)
    by_name = {op.name: op for op in sched.ops}
    qkv, attn = by_name["L0.mb0.fwd.qkv"], by_name["L0.mb0.fwd.attn"]
    q_norm, k_norm = by_name["L0.mb0.fwd.q_norm"], by_name["L0.mb0.fwd.k_norm"]
    assert qkv.id in q_norm.deps and qkv.id in k_norm.deps
    assert set(attn.deps) == {q_norm.id, k_norm.id}
    assert by_name["L0.mb0.bwd.attn"].id in by_name["L0.mb0.bwd.q_norm"].deps
    assert not any(op.name.endswith(("q_norm", "k_norm")) for op in build_schedule(tiny(GQA)).ops)  # off


def test_recompute_of_the_core_does_not_rerun_the_norms_but_full_recompute_does():
    selective = build_schedule(tiny({**GQA, "model.qk_norm": True, "parallel.recompute": "selective"}))
    full = build_schedule(tiny({**GQA, "model.qk_norm": True, "parallel.recompute": "full"}))
    assert ops_named(selective, "L0.mb0.recompute.attn") and not ops_named(selective, "L0.mb0.recompute.q_norm")
    assert ops_named(full, "L0.mb0.recompute.q_norm") and ops_named(full, "L0.mb0.recompute.k_norm")


def test_parameters_and_their_tp_sum_without_sp():
    """Two norms of head_dim 64 per layer (RMSNorm: 64 each; LayerNorm: 128). Without SP the TP ranks still
    sum their gradients (Megatron's finalize_model_grads): opt.ln_grad = layers x 128 fp32 values; at
    tp = 1 nothing is summed, and without qk_norm tp without SP issues no opt.ln_grad."""
    rs = tiny({**GQA, "model.qk_norm": True})
    assert qk_norm_params(rs.scenario.model) == 2 * 64
    assert qk_norm_params(tiny({"model.qk_norm": True}).scenario.model) == 2 * 128  # gelu: LayerNorm
    assert layer_dims(rs).norm_params_per_layer == 2 * 256 + 128
    ln = ops_named(build_schedule(rs), "opt.ln_grad")
    assert len(ln) == 1 and ln[0].work.nbytes == 2 * 128 * 4
    assert not ops_named(build_schedule(tiny(GQA)), "opt.ln_grad")
    one = tiny({**GQA, "model.qk_norm": True, "parallel.tp": 1})
    assert not ops_named(build_schedule(one), "opt.ln_grad")
    sp = build_schedule(tiny({**GQA, "model.qk_norm": True, "parallel.sp": True}))
    sp_off = build_schedule(tiny({**GQA, "parallel.sp": True}))
    assert ops_named(sp, "opt.ln_grad")[0].work.nbytes - ops_named(sp_off, "opt.ln_grad")[0].work.nbytes == 2 * 128 * 4


def test_the_norms_inputs_are_kept_for_backward():
    on, off = layer_dims(tiny({**GQA, "model.qk_norm": True})), layer_dims(tiny(GQA))
    assert layer_activation_bytes(on) - layer_activation_bytes(off) == 256 * 2 * (2 + 1) * 64


def test_mla_keeps_its_latent_norms_and_adds_nothing():
    mla = {"model.mla": {"kv_lora_rank": 64, "qk_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
           "model.mlp": "swiglu", "model.bias": False}
    with_flag, without = tiny({**mla, "model.qk_norm": True}), tiny(mla)
    assert qk_norm_params(with_flag.scenario.model) == 0
    assert [op.name for op in build_schedule(with_flag).ops] == [op.name for op in build_schedule(without).ops]


@pytest.mark.slow
def test_validate_runs_the_norms_for_real_and_a_missing_gradient_sum_fails():
    pytest.importorskip("torch")
    from meshsim.validate.numerics.check import check_numerics

    scenario, source = load_scenario("tiny-2gpu")
    specs = ["tp+swiglu+gqa+selective+qknorm", "sp+gelu+mha+full+qknorm", "tp+swiglu+gqa+qknorm+no_ln_allreduce"]
    out = {r.name: r for r in check_numerics(scenario, source, 2, specs)}
    for spec in specs[:2]:
        assert out[spec].ok and out[spec].op_diffs == [], (spec, out[spec].errors, out[spec].mismatches[:3])
    bad = out[specs[2]]
    assert not bad.ok
    names = {m["tensor"] for m in bad.mismatches}
    assert names and all(n.split(".")[-3] in ("q_norm", "k_norm") for n in names), names
    assert any(d.startswith("opt.ln_grad") for d in bad.op_diffs)
