"""FP8 for MoE layers: the experts' and shared expert's grouped / TE GEMMs in FP8 with their quantize kernels,
the router and the token dispatch in 16 bit, the expert weights in the once-per-step cast; the unmodeled MoE
recipes refused with one line."""

from __future__ import annotations

import copy

import pytest

from meshsim.scenarios.load import load_scenario, resolve, with_overrides
from meshsim.sim.core.errors import UserError
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.builder import build_schedule
from meshsim.sim.schedule.fp8_rules import BLOCKWISE_BLOCK, BLOCKWISE_SCALE_BYTES
from meshsim.sim.schedule.ops import Gemm

MOE = {"model.moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512, "shared_ffn_hidden": 256}, "model.bias": False,
       "model.mlp": "swiglu", "topology.preset": "dgx-h100"}


def tiny(overrides: dict, gpus: int = 8):
    scenario, source = load_scenario("tiny-2gpu")
    base = {"parallel.gpus": gpus, "parallel.tp": 1, "parallel.global_batch": gpus, "parallel.micro_batch": 1,
            "parallel.ep": 4, **copy.deepcopy(MOE)}
    return resolve(with_overrides(scenario, {**base, **overrides}, source), source)


def layer(rs, phase: str) -> dict:
    return {op.name.split(".", 3)[-1]: op.work for op in build_schedule(rs).ops
            if op.layer == 1 and op.micro_batch == 0 and op.phase == phase}


def test_expert_and_shared_gemms_run_fp8_router_and_dispatch_stay_16_bit():
    fp8, bf16 = layer(tiny({"run.fp8": "blockwise"}), "fwd"), layer(tiny({}), "fwd")
    for key in ("expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2"):
        assert fp8[key].fp8 and not bf16[key].fp8
    assert isinstance(fp8["router"], Gemm) and not fp8["router"].fp8
    assert fp8["dispatch"] == bf16["dispatch"] and fp8["combine"] == bf16["combine"]  # 16-bit tokens on the wire
    rows, h = 128 * 2, 256  # T k rows on this rank (2 local experts), hidden
    q = fp8[f"expert_fc1_{K.FP8_QUANT}"]  # rowwise + columnwise copies of the rows, 1 B + 4 B per 128 values
    n = rows * h
    assert (q.bytes_read, q.bytes_written) == (2 * n, 2 * (n + n // BLOCKWISE_BLOCK * BLOCKWISE_SCALE_BYTES))
    assert set(fp8) - set(bf16) == {f"{g}_{K.FP8_QUANT}" for g in ("qkv", "proj", "expert_fc1", "expert_fc2",
                                                                   "shared_fc1", "shared_fc2")}


def test_backward_quantizes_each_output_gradient_and_wgrads_follow_fp8_wgrad():
    bwd = layer(tiny({"run.fp8": "tensorwise"}), "bwd")
    assert {f"expert_fc2_{K.FP8_QUANT}", f"expert_fc1_{K.FP8_QUANT}", f"expert_fc2_{K.FP8_AMAX}"} <= set(bwd)
    assert bwd["expert_fc1_wgrad"].fp8 and bwd["expert_fc2_dgrad"].fp8
    off = layer(tiny({"run.fp8": "tensorwise", "run.fp8_wgrad": False}), "bwd")
    assert not off["expert_fc1_wgrad"].fp8 and off["expert_fc1_dgrad"].fp8  # negative control


def test_weight_cast_counts_attention_expert_and_shared_weights():
    rs = tiny({"run.fp8": "blockwise"})
    cast = [op.work for op in build_schedule(rs).ops if op.name == f"opt.{K.FP8_WEIGHT_CAST}"]
    h, heads, kv, hd, layers = 256, rs.scenario.model.heads, rs.scenario.model.kv_heads, 256 // rs.scenario.model.heads, \
        rs.scenario.model.layers
    attention = h * (heads + 2 * (kv or heads)) * hd + heads * hd * h
    experts = 2 * (h * 1024 + 512 * h)  # two local experts, SwiGLU fc1 of 2 x 512
    shared = h * 512 + 256 * h
    assert cast[0].bytes_read == 2 * layers * (attention + experts + shared)


@pytest.mark.parametrize("overrides, field", [
    ({"run.fp8": "blockwise", "run.fp8_param_gather": True, "parallel.distributed_optimizer": True},
     "run.fp8_param_gather"),
    ({"run.fp8": "delayed", "run.fp8_param_gather": True, "parallel.distributed_optimizer": True},
     "run.fp8_param_gather"),
])
def test_unmodeled_fp8_moe_settings_are_refused(overrides, field):
    with pytest.raises(UserError) as err:
        tiny(overrides)
    assert err.value.field == field


def test_memory_adds_fp8_copies_of_attention_expert_and_shared_weights_and_saves_their_inputs():
    from meshsim.sim.core.units import GB
    from meshsim.sim.cost.memory import memory_per_gpu

    on, off = tiny({"run.fp8": "tensorwise"}), tiny({})
    m_on, m_off = memory_per_gpu(on), memory_per_gpu(off)
    h, model = 256, on.scenario.model
    hd = h // model.heads
    attention = h * (model.heads + 2 * (model.kv_heads or model.heads)) * hd + model.heads * hd * h
    weights = model.layers * (attention + 2 * (h * 1024 + 512 * h) + (h * 512 + 256 * h))
    assert m_on.weights_gb - m_off.weights_gb == pytest.approx(2 * weights / GB)  # rowwise + columnwise copies
    t, rows = 128, 128 * 2  # tokens, routed rows on this rank
    saved = t * h + t * model.heads * hd + rows * (h + 512) + t * 256  # qkv, proj, expert fc1 / fc2, shared fc2
    assert m_off.activations_gb - m_on.activations_gb == pytest.approx(model.layers * saved / GB)
