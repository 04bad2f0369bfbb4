"""FP8 for multi-head latent attention (sim/schedule/mla_ops.py): the five projections' GEMMs in FP8 with their
quantize kernels, the latents gathered in FP8 under SP, the rotary part and the attention core in 16 bit
(FP8 with run.fp8_attention), the projections' weights in the once-per-step cast; 16-bit MLA untouched."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.fp8_rules import fp8_tensor_bytes
from meshsim.sim.schedule.mla_ops import mla_dims
from meshsim.sim.schedule.moe_shapes import fp8_linear_weights
from meshsim.sim.schedule.ops import Attention, Gemm
from meshsim.sim.schedule.shapes import layer_dims

MLA = {"model.mla": {"q_lora_rank": 96, "kv_lora_rank": 64, "qk_head_dim": 32, "qk_rope_head_dim": 16,
                     "v_head_dim": 32}, "model.mlp": "swiglu", "model.bias": False, "model.norm": "rmsnorm"}
PROJECTIONS = ("q_down", "q_up", "kv_down", "kv_up", "proj")


def tiny(overrides: dict):
    """tiny-2gpu (tp 2 + SP) with MLA, on DGX B200s (every FP8 recipe runs there)."""
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.sp": True, "topology.preset": "dgx-b200", **copy.deepcopy(MLA)}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def layer0(rs) -> dict:
    return {op.name.split(".", 2)[-1]: op.work for op in build_schedule(rs).ops if op.name.startswith("L0.mb0.")}


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_every_projection_runs_fp8_after_a_quantize_kernel(recipe):
    ops = layer0(tiny({"run.fp8": recipe}))
    for key in PROJECTIONS:
        assert ops[f"fwd.{key}"].fp8 and ops[f"bwd.{key}_dgrad"].fp8 and ops[f"bwd.{key}_wgrad"].fp8
        assert f"fwd.{key}_{K.FP8_QUANT}" in ops and f"bwd.{key}_{K.FP8_QUANT}" in ops
    assert not ops["fwd.attn"].fp8 and not ops["bwd.attn"].fp8  # the core stays 16-bit ...
    if recipe == "blockwise":  # TE refuses FP8 attention under Float8BlockScaling (recipe/__init__.py L461-463)
        with pytest.raises(UserError):
            tiny({"run.fp8": recipe, "run.fp8_attention": True})
        return
    on = layer0(tiny({"run.fp8": recipe, "run.fp8_attention": True}))
    assert isinstance(on["fwd.attn"], Attention) and on["fwd.attn"].fp8  # ... unless run.fp8_attention


def test_wgrad_in_16_bit_when_asked():
    ops = layer0(tiny({"run.fp8": "mxfp8", "run.fp8_wgrad": False}))
    assert all(ops[f"fwd.{key}"].fp8 and not ops[f"bwd.{key}_wgrad"].fp8 for key in PROJECTIONS)


def test_latents_are_gathered_in_fp8_and_the_rotary_part_in_16_bit():
    rs = tiny({"run.fp8": "mxfp8"})
    ops, a = layer0(rs), rs.scenario.model.mla
    tokens = rs.scenario.model.seq_len * rs.scenario.parallel.micro_batch
    assert ops[f"fwd.{K.ATTN_IN}_q"].nbytes == fp8_tensor_bytes(tokens * a.q_lora_rank, "mxfp8")
    assert ops[f"fwd.{K.ATTN_IN}_kv"].nbytes == fp8_tensor_bytes(tokens * a.kv_lora_rank, "mxfp8")
    assert ops[f"fwd.{K.ATTN_IN}_rope"].nbytes == tokens * a.qk_rope_head_dim * 2


def test_sixteen_bit_mla_has_no_fp8_work():
    ops = layer0(tiny({}))
    assert not any(isinstance(w, Gemm) and w.fp8 for w in ops.values())
    assert not any(K.FP8_QUANT in key or K.FP8_TRANSPOSE in key for key in ops)


def test_fp8_weights_are_the_five_projections_and_the_mlp():
    rs = tiny({"run.fp8": "blockwise"})
    d = layer_dims(rs)
    m = rs.scenario.model
    h, mla = m.hidden, mla_dims(d, m.mla)
    q = h * 96 + 96 * mla.heads * (32 + 16)
    kv = h * (64 + 16) + 64 * mla.heads * (32 + 32)
    proj = mla.heads * 32 * h
    mlp = h * 2 * d.ffn + d.ffn * h  # SwiGLU fc1 (gate + up) and fc2 on this rank
    assert mla.linear_weights(h) == q + kv + proj
    assert fp8_linear_weights(rs, d, range(m.layers)) == m.layers * (q + kv + proj + mlp)
    cast = [op.work for op in build_schedule(rs).ops if op.name == f"opt.{K.FP8_WEIGHT_CAST}"]
    assert cast[0].bytes_read == 2 * m.layers * (q + kv + proj + mlp)


def test_fp8_output_proj_runs_the_lm_head_in_mxfp8():
    def head(overrides):
        ops = build_schedule(tiny({"run.fp8": "mxfp8", **overrides})).ops
        return {op.name.split(".", 2)[-1]: op.work for op in ops if op.name.startswith("head.mb0.")}

    off, on = head({}), head({"run.fp8_output_proj": True})
    assert not off["fwd.logits"].fp8 and not any(K.FP8_QUANT in key for key in off)  # 16-bit LM head by default
    assert on["fwd.logits"].fp8 and on["bwd.logits_dgrad"].fp8 and on["bwd.logits_wgrad"].fp8
    assert f"fwd.logits_{K.FP8_QUANT}" in on and f"bwd.logits_{K.FP8_QUANT}" in on
    rs = tiny({"run.fp8": "mxfp8"})
    tokens, h = rs.scenario.model.seq_len * rs.scenario.parallel.micro_batch, rs.scenario.model.hidden
    assert off[f"fwd.{K.HEAD_IN}"].nbytes == tokens * h * 2
    assert on[f"fwd.{K.HEAD_IN}"].nbytes == fp8_tensor_bytes(tokens * h, "mxfp8")


@pytest.mark.parametrize("overrides", [{"run.fp8": "blockwise"}, {"run.fp8": "mxfp8", "model.tied_embeddings": True}])
def test_fp8_output_proj_needs_mxfp8_and_an_untied_head(overrides):
    from meshsim.sim.core.errors import UserError

    with pytest.raises(UserError) as err:
        tiny({**overrides, "run.fp8_output_proj": True})
    assert err.value.field == "run.fp8_output_proj"


def test_an_fp8_lm_head_joins_the_weight_cast_and_memory():
    from meshsim.sim.core.units import GB
    from meshsim.sim.cost.fp8_memory import fp8_weight_extra_bytes
    from meshsim.sim.cost.memory import memory_per_gpu

    def cast(rs):
        return next(op.work for op in build_schedule(rs).ops if op.name == f"opt.{K.FP8_WEIGHT_CAST}")

    off, on = tiny({"run.fp8": "mxfp8"}), tiny({"run.fp8": "mxfp8", "run.fp8_output_proj": True})
    d = layer_dims(on)
    assert cast(on).bytes_read - cast(off).bytes_read == 2 * d.vocab * d.hidden
    extra = fp8_weight_extra_bytes(d, d.vocab * d.hidden, False)  # rowwise + columnwise MXFP8 copies with scales
    assert memory_per_gpu(on).weights_gb - memory_per_gpu(off).weights_gb == pytest.approx(extra / GB)
