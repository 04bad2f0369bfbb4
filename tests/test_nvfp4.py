"""run.fp8: nvfp4 (Transformer Engine's NVFP4BlockScaling under Megatron's --fp4-recipe nvfp4): GEMMs at the FP4
peak with half-byte operands and their scales, the amax pass and its TP reduction, the wire and memory bytes, and
the rules that refuse what it cannot run. Closed forms against the FP8 recipes' (tests/test_fp8.py)."""

from __future__ import annotations

import pytest
from test_fp8 import B, H, S, _ops, make_rs

from meshsim.scenarios.fp8_checks import check_fp8
from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.fp8_gemm import NVFP4_OPERAND_BYTES
from meshsim.sim.cost.fp8_memory import fp8_saved_bytes, weight_copy_bytes
from meshsim.sim.cost.gemm_efficiency import gemm_efficiency
from meshsim.sim.schedule import op_keys as K
from meshsim.sim.schedule.fp8_rules import Fp8Plan, fp8_tensor_bytes, quantize_works, weight_cast_work
from meshsim.sim.schedule.ops import Collective, Gemm
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.topologies.gpus import GPUS

B200 = GPUS["b200"]


def test_nvfp4_gemm_runs_at_the_fp4_peak_with_the_block_scaled_fraction():
    """8192^3 on B200 (the shape model's reference): the fraction of the FP8 peak an MXFP8 GEMM reaches
    (0.52 x 0.92; was 0.51 before issue 42) applied to the FP4 peak (9,000): half the MXFP8 time, less
    the launch. A skinny-k GEMM keeps less of it: k_fill grows with the peak (closed form from the shape
    model)."""
    nv, mx = ComputeModel(B200, fp8_recipe="nvfp4"), ComputeModel(B200, fp8_recipe="mxfp8")
    ceiling = 0.52 * 0.92
    g = Gemm(8192, 8192, 8192, fp8=True)
    assert nv.gemm_efficiency(g) == pytest.approx(ceiling, rel=1e-12)
    assert nv.gemm_s(g) == pytest.approx(2 * 8192**3 / (9000e12 * ceiling) + 3e-6, rel=1e-12)
    assert nv.gemm_s(g) - 3e-6 == pytest.approx((mx.gemm_s(g) - 3e-6) / 2, rel=1e-12)
    skinny = Gemm(8192, 8192, 256, fp8=True)
    tiles = ((128, 256), (256, 128), (128, 128))
    expected = {peak: gemm_efficiency(8192, 8192, 256, 1, ceiling=ceiling, tiles=tiles, sm_count=B200.sm_count,
                                      k_fill=peak * 1e3 / B200.mem_bw_gbps, out_bytes=2) for peak in (9000, 4500)}
    assert nv.gemm_efficiency(skinny) == pytest.approx(expected[9000], rel=1e-12)
    assert mx.gemm_efficiency(skinny) == pytest.approx(expected[4500], rel=1e-12)
    assert expected[4500] > expected[9000]
    tall = Gemm(64, 8192, 8192, fp8=True)  # memory-bound: half-byte operands plus scales
    nbytes = NVFP4_OPERAND_BYTES * (64 * 8192 + 8192 * 8192) + 2 * 64 * 8192
    assert nv.gemm_s(tall) >= nbytes / nv.mem_bw_bytes_s


def test_blackwell_ultra_fp4_is_one_and_a_half_blackwell_at_the_same_fp8_rate():
    """B300 takes B200's constants at rate 1 on the FP8 peak; its FP4 peak is 1.5x B200's: a large NVFP4 GEMM
    runs 1.5x faster relative to B200 than its MXFP8 one does (the same fraction of a 1.5x peak, k_fill aside)."""
    g = Gemm(16384, 16384, 16384, fp8=True)
    mx200, mx300 = (ComputeModel(GPUS[n], fp8_recipe="mxfp8").gemm_s(g) for n in ("b200", "b300"))
    assert mx300 == pytest.approx(mx200, rel=0.05)  # B300's 160 SMs against 148: waves differ a little
    nv200, nv300 = (ComputeModel(GPUS[n], fp8_recipe="nvfp4").gemm_s(g) for n in ("b200", "b300"))
    assert (nv200 / nv300) / (mx200 / mx300) == pytest.approx(1.5, rel=0.03)


def test_quantize_reads_for_the_amax_then_writes_half_bytes_and_scales():
    n = 4096
    amax, q = quantize_works(n, 2, Fp8Plan("nvfp4"))
    assert (amax.kernel, amax.bytes_read, q.bytes_read) == ("fp8_amax", 2 * n, 2 * n)
    assert q.bytes_written == 2 * (n // 2 + n // 16)  # rowwise and columnwise, each with its E4M3 scales
    assert fp8_tensor_bytes(n, "nvfp4") == n // 2 + n // 16
    cast = weight_cast_work(n * 256, n * 256, False, recipe="nvfp4")
    assert cast.bytes_written == 2 * (n * 128 + n)  # half a byte + a scale per 16 x 16 weight block


def test_sp_gathers_move_half_bytes_and_the_amax_is_reduced_over_tp():
    rs = make_rs({"tp": 2, "sp": True}, {"fp8": "nvfp4"}, gpu="b200")
    ops = _ops(rs)
    n = S * B * H
    gathers = {op.name: op.work.nbytes for op in ops if op.name.startswith("L0.mb0.")
               and isinstance(op.work, Collective) and op.work.op == "all_gather"}
    assert gathers["L0.mb0.fwd.attn_in"] == n // 2 + n // 16
    assert gathers["L0.mb0.bwd.attn_out"] == 2 * (n // 2 + n // 16)  # dY: both directions, as MXFP8
    amax = [op.name for op in ops if op.name.startswith("L0.mb0.") and op.name.endswith(K.FP8_AMAX + K.ALL_REDUCE)]
    assert sorted(amax) == ["L0.mb0.bwd.fc2_fp8_amax_ar", "L0.mb0.bwd.proj_fp8_amax_ar",
                            "L0.mb0.fwd.fc1_fp8_amax_ar", "L0.mb0.fwd.qkv_fp8_amax_ar"]
    attention = [op.work for op in ops if op.name.startswith("L0.mb0.fwd.attn") and hasattr(op.work, "heads")]
    assert attention and not any(a.fp8 for a in attention)  # TE's NVFP4 recipe quantizes no attention


def test_memory_half_byte_weight_copies_and_saved_inputs():
    d = layer_dims(make_rs({}, {"fp8": "nvfp4"}, gpu="b200"))
    assert weight_copy_bytes(d) == pytest.approx(2 * (0.5 + 1 / 256))
    assert fp8_saved_bytes(1600, "nvfp4") == 1600 * 2 - (800 + 100)
    assert fp8_saved_bytes(1600, "nvfp4") > fp8_saved_bytes(1600, "mxfp8")


@pytest.mark.parametrize("run,gpu,field", [
    ({"fp8": "nvfp4"}, "h100-sxm", "run.fp8"),  # Hopper has no FP4 tensor cores
    ({"fp8": "blockwise", "fp8_attention": True}, "b200", "run.fp8_attention"),  # TE recipe L461-463
    ({"fp8": "nvfp4", "fp8_param_gather": True}, "b200", "run.fp8_param_gather"),
])
def test_nvfp4_rules(run, gpu, field):
    rs = make_rs({}, {}, gpu=gpu)
    scenario = rs.scenario.model_copy(update={"run": rs.scenario.run.model_copy(update=run)})
    if run.get("fp8_param_gather"):
        scenario = scenario.model_copy(update={"parallel": scenario.parallel.model_copy(
            update={"distributed_optimizer": True})})
    with pytest.raises(UserError) as err:
        check_fp8(scenario, GPUS[gpu], "test")
    assert err.value.field == field and "\n" not in str(err.value)
    check_fp8(rs.scenario.model_copy(update={"run": rs.scenario.run.model_copy(update={"fp8": "nvfp4"})}),
              B200, "test")  # negative control: plain nvfp4 on Blackwell passes


def test_first_and_last_layers_can_stay_16_bit():
    """run.fp8_first_last_layers_bf16 (Megatron --first-last-layers-bf16, 1 + 1 layers by default): those layers'
    GEMMs are 16-bit and quantize nothing, they add no FP8 weight copy and keep their 16-bit saved inputs."""
    from meshsim.sim.cost.fp8_memory import fp8_activation_savings
    from meshsim.sim.cost.memory import memory_per_gpu
    from meshsim.sim.schedule.moe_shapes import fp8_linear_weights

    model = {"layers": 4, "hidden": H, "heads": 8, "kv_heads": 4, "ffn_hidden": 512, "seq_len": S, "vocab": 1000,
             "mlp": "swiglu", "dropout": False, "attention": "flash"}
    on = make_rs({}, {"fp8": "nvfp4", "fp8_first_last_layers_bf16": True}, gpu="b200", model=model)
    base = make_rs({}, {"fp8": "nvfp4"}, gpu="b200", model=model)
    ops = _ops(on)
    for layer, fp8 in ((0, False), (1, True), (2, True), (3, False)):
        gemms = [op.work for op in ops if op.name.startswith(f"L{layer}.mb0.") and isinstance(op.work, Gemm)]
        assert gemms and all(g.fp8 == fp8 for g in gemms)
        assert any(K.FP8_QUANT in op.name for op in ops if op.name.startswith(f"L{layer}.mb0.")) == fp8
    d = layer_dims(base)
    assert fp8_linear_weights(on, d, range(4)) == fp8_linear_weights(base, d, range(4)) // 2
    extra = memory_per_gpu(on).activations_gb - memory_per_gpu(base).activations_gb
    assert extra * 1e9 == pytest.approx(2 * fp8_activation_savings(d))
    assert not any(g.fp8 for op in _ops(make_rs({}, {}, gpu="b200", model=model)) for g in [op.work]
                   if isinstance(g, Gemm))  # negative control: 16 bit everywhere


@pytest.mark.parametrize("run,field", [
    ({"fp8_first_last_layers_bf16": True}, "run.fp8_first_last_layers_bf16"),  # needs an FP8 recipe
    ({"fp8": "mxfp8", "fp8_layers_at_end_in_bf16": 2}, "run.fp8_layers_at_end_in_bf16"),  # needs the switch
])
def test_first_last_bf16_rules(run, field):
    rs = make_rs({}, {}, gpu="b200")
    with pytest.raises(UserError) as err:
        check_fp8(rs.scenario.model_copy(update={"run": rs.scenario.run.model_copy(update=run)}), B200, "test")
    assert err.value.field == field


def test_the_error_band_says_no_published_run_checks_nvfp4():
    from meshsim.sim.results.error_band import band_for

    rs = make_rs({}, {"fp8": "nvfp4"}, gpu="b200")
    text = band_for(rs.scenario).sentence()
    assert text.startswith("±") and "none of them runs NVFP4, so that part is unchecked" in text
    mx = make_rs({}, {"fp8": "mxfp8"}, gpu="b200")  # negative control: a recipe the fp8 group's cases run
    assert "unchecked" not in band_for(mx.scenario).sentence()
