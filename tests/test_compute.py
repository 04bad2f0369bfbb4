"""Compute cost model: GEMM roofline and efficiency, wave quantization, memory-bound kernels, profiles,
and the calibrated collective table."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshsim.scenarios.profile import CollectivePoint, GemmPoint, HardwareProfile, KernelPoint
from meshsim.scenarios.schema import ComputeTuning
from meshsim.sim.cost.attention_rate import softmax_to_mma, width_factor
from meshsim.sim.cost.calibrated import table_collective_time_s
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.schedule.ops import Attention, Collective, Elementwise, Gemm, OptimizerStep
from meshsim.topologies.gpus import GPUS

H100 = GPUS["h100-sxm"]
LAUNCH_S = 3e-6


def tflops(model: ComputeModel, g: Gemm) -> float:
    return g.flops / model.time_s(g) / 1e12


def test_reference_gemm_reaches_the_ceiling():
    """8192^3 is the reference shape: it runs at the GPU generation's sustained ceiling (a training step's: H100
    0.68 and A100 0.78 fitted on training steps, H200 0.70 from its measured 0.80 at H100's sustained clock;
    sim/cost/gemm_ceiling.py), and at a stated gemm_efficiency when the scenario gives one."""
    g = Gemm(8192, 8192, 8192)
    for gpu, ceiling in ((H100, 0.68), (GPUS["a100-80gb"], 0.78), (GPUS["h200-sxm"], 0.70)):
        assert ComputeModel(gpu).time_s(g) == pytest.approx(g.flops / (gpu.peak_tflops * 1e12 * ceiling) + LAUNCH_S)
    stated = ComputeModel(H100, ComputeTuning(gemm_efficiency=0.6)).time_s(g)
    assert stated == pytest.approx(g.flops / (H100.peak_tflops * 1e12 * 0.6) + LAUNCH_S)


def test_ceiling_override():
    g = Gemm(8192, 8192, 8192)
    model = ComputeModel(H100, ComputeTuning(gemm_efficiency=0.5, launch_overhead_us=0.0))
    assert model.time_s(g) == pytest.approx(g.flops / (989e12 * 0.5))


@pytest.mark.parametrize("shape", ["column", "row"])
def test_efficiency_falls_as_the_sharded_dimension_shrinks(shape):
    """Llama-2 70B qkv (column-parallel: n = 10240/t) and fc2 (row-parallel: k = 28672/t), s*b = 4096."""
    model = ComputeModel(H100)
    rates = []
    for t in (1, 2, 4, 8, 16):
        g = Gemm(4096, 10240 // t, 8192) if shape == "column" else Gemm(4096, 8192, 28672 // t)
        rates.append(tflops(model, g))
    pairs = list(zip(rates, rates[1:], strict=False))
    if shape == "row":  # k / (k + k_fill) falls strictly with k
        assert all(a > b for a, b in pairs), rates
    else:  # tiles fall; wave quantization may leave a step flat, never better
        assert all(a >= b for a, b in pairs) and rates[-1] < 0.9 * rates[0], rates


def test_wave_quantization():
    """One fixed 128x256 tile: 12 x 11 = 132 tiles fill the 132 SMs once; 7 x 19 = 133 tiles need a
    second wave. Both compute-bound (k = 8192), so time per FLOP scales by (264 / 133) / (132 / 132)."""
    model = ComputeModel(H100, ComputeTuning(tile_m=128, tile_n=256, launch_overhead_us=0.0))
    full = Gemm(128 * 12, 256 * 11, 8192)
    over = Gemm(128 * 7, 256 * 19, 8192)
    per_flop = [model.time_s(g) / g.flops for g in (full, over)]
    assert per_flop[1] > 1.9 * per_flop[0]  # 133/264 vs 132/132 of the SM-waves do useful work
    assert per_flop[1] / per_flop[0] == pytest.approx(264 / 133, rel=1e-9)


def test_wave_quantization_with_the_tile_heuristic():
    model = ComputeModel(H100)
    full, over = Gemm(128 * 12, 256 * 11, 8192), Gemm(128 * 7, 256 * 19, 8192)
    assert model.time_s(over) / over.flops > model.time_s(full) / full.flops


def test_skinny_k_loses_efficiency():
    """k / (k + k_fill), k_fill = peak / bw = 989e12 / 3350e9 on an H100, relative to k = 8192."""
    model = ComputeModel(H100, ComputeTuning(launch_overhead_us=0.0))
    k_fill = 989e12 / 3350e9
    big, small = Gemm(8192, 8192, 8192), Gemm(8192, 8192, 512)
    ratio = tflops(model, small) / tflops(model, big)
    assert ratio == pytest.approx((512 / (512 + k_fill)) / (8192 / (8192 + k_fill)), rel=1e-9)


def test_fp32_accumulating_wgrad_pays_four_times_the_epilogue():
    """out_bytes 8 (read + write an fp32 C): k_fill x 4 for the shape, the reference GEMM unchanged."""
    model = ComputeModel(H100, ComputeTuning(launch_overhead_us=0.0))
    k_fill = 989e12 / 3350e9
    plain, fused = Gemm(8192, 8192, 4096), Gemm(8192, 8192, 4096, out_bytes=8)
    ratio = tflops(model, fused) / tflops(model, plain)
    assert ratio == pytest.approx((4096 / (4096 + 4 * k_fill)) / (4096 / (4096 + k_fill)), rel=1e-9)
    assert tflops(model, Gemm(8192, 8192, 8192)) == pytest.approx(989 * 0.68)  # the reference is unmoved
    slow_mem = dataclasses.replace(H100, mem_bw_gbps=1.0)  # and the roofline counts 8 bytes per C element
    nbytes = 2 * 2 * 4096 * 4096 + 8 * 4096 * 4096
    assert ComputeModel(slow_mem).time_s(Gemm(4096, 4096, 4096, out_bytes=8)) == pytest.approx(
        nbytes / (1e9 * 0.9) + LAUNCH_S)


def test_memory_bound_gemm_uses_the_bandwidth_roof():
    slow_mem = dataclasses.replace(H100, mem_bw_gbps=1.0)
    g = Gemm(4096, 4096, 4096)
    nbytes = 2 * (3 * 4096 * 4096)
    assert ComputeModel(slow_mem).time_s(g) == pytest.approx(nbytes / (1e9 * 0.9) + LAUNCH_S)


def test_elementwise_and_optimizer_are_bandwidth_bound():
    """Elementwise kernels at 0.65 of HBM (ELEMENTWISE_EFFICIENCY), the optimizer's streams at 0.90."""
    model = ComputeModel(H100)
    e = Elementwise("layernorm", 3_000_000, 1_000_000)
    assert model.time_s(e) == pytest.approx(4e6 / (3350e9 * 0.65) + LAUNCH_S)
    opt = OptimizerStep(1_000_000)
    assert model.time_s(opt) == pytest.approx(32e6 / (3350e9 * 0.9) + LAUNCH_S)


def test_flash_attention_fraction_of_peak():
    """b 2 x 8 heads x 32 query blocks = 512 CTAs -> 4 waves of 132: wave efficiency 512/528."""
    a = Attention(batch=2, heads=8, kv_heads=1, seq=4096, head_dim=128)
    expected = a.flops / (989e12 * 0.43 * 512 / 528) + LAUNCH_S  # the H100's attention_efficiency
    assert ComputeModel(H100).time_s(a) == pytest.approx(expected)
    bwd = dataclasses.replace(a, backward=True)
    assert ComputeModel(H100).time_s(bwd) - LAUNCH_S == pytest.approx(2.5 * (expected - LAUNCH_S))


def test_collectives_are_not_compute():
    with pytest.raises(TypeError):
        ComputeModel(H100).time_s(Collective("all_reduce", "tp", 1024))


# ----- tuning precedence and profiles ---------------------------------------------------------------------
def test_scenario_tuning_beats_profile_beats_default():
    prof = HardwareProfile(name="p", compute=ComputeTuning(elementwise_efficiency=0.5, mem_bw_efficiency=0.6,
                                                           launch_overhead_us=10.0))
    model = ComputeModel(H100, ComputeTuning(launch_overhead_us=1.0), prof)
    assert model.knobs.launch_overhead_us == 1.0
    assert model.knobs.elementwise_efficiency == 0.5
    assert model.knobs.attention_efficiency == 0.43  # the H100's generation value (attention_rate.py)
    e = Elementwise("x", 1_000_000, 0)
    assert model.time_s(e) == pytest.approx(1e6 / (3350e9 * 0.5) + 1e-6)  # elementwise: its own fraction
    opt = OptimizerStep(1000)
    assert model.time_s(opt) == pytest.approx(1000 * 32 / (3350e9 * 0.6) + 1e-6)  # streaming: mem_bw_efficiency


def test_profile_gemm_table_uses_the_nearest_shape():
    prof = HardwareProfile(name="p", gemm_table=[GemmPoint(m=4096, n=4096, k=4096, tflops=500.0),
                                                  GemmPoint(m=4096, n=512, k=4096, tflops=200.0)])
    model = ComputeModel(H100, profile=prof)
    exact = Gemm(4096, 4096, 4096)
    assert model.time_s(exact) == pytest.approx(exact.flops / 500e12)
    near_small = Gemm(4096, 640, 4096)  # log-distance to n=512: 0.22; to n=4096: 1.86
    assert model.time_s(near_small) == pytest.approx(near_small.flops / 200e12)


def test_profile_elementwise_bandwidth_and_kernel_table():
    prof = HardwareProfile(name="p", elementwise_bw_gbps=2000.0,
                           kernel_table=[KernelPoint(kernel="softmax", bytes=1_000_000, time_us=5.0),
                                         KernelPoint(kernel="flash_attention_fwd", flops=1e12, time_us=2000.0)])
    model = ComputeModel(H100, profile=prof)
    assert model.time_s(Elementwise("gelu", 2_000_000, 0)) == pytest.approx(2e6 / 2000e9 + LAUNCH_S)
    assert model.time_s(Elementwise("softmax", 1_000_000, 1_000_000)) == pytest.approx(10e-6)
    a = Attention(batch=1, heads=8, kv_heads=8, seq=4096, head_dim=128)
    assert model.time_s(a) == pytest.approx(2000e-6 * a.flops / 1e12)


# ----- calibrated collectives -------------------------------------------------------------------------------
def _prof(points):
    return HardwareProfile(name="p", collective_table=[
        CollectivePoint(op=op, ranks=r, nbytes=b, time_us=t, algbw_gbps=0.0, busbw_gbps=0.0)
        for op, r, b, t in points])


def test_table_interpolates_in_log_bytes():
    prof = _prof([("all_reduce", 8, 1 << 20, 20.0), ("all_reduce", 8, 1 << 24, 100.0),
                  ("all_reduce", 4, 1 << 22, 999.0), ("all_gather", 8, 1 << 22, 999.0)])
    mid = table_collective_time_s(prof, "all_reduce", 8, 1 << 22)  # log-midpoint of 1M and 16M
    assert mid == pytest.approx(60e-6)
    quarter = table_collective_time_s(prof, "all_reduce", 8, 1 << 21)
    assert quarter == pytest.approx(40e-6)


def test_table_extrapolates_linearly_in_bytes():
    prof = _prof([("all_gather", 8, 1000, 10.0), ("all_gather", 8, 2000, 12.0), ("all_gather", 8, 4000, 16.0)])
    slope_us = (16.0 - 12.0) / 2000
    assert table_collective_time_s(prof, "all_gather", 8, 10000) == pytest.approx((16.0 + slope_us * 6000) * 1e-6)
    low_slope = (12.0 - 10.0) / 1000
    assert table_collective_time_s(prof, "all_gather", 8, 500) == pytest.approx((10.0 - low_slope * 500) * 1e-6)


def test_table_single_point_and_no_match():
    prof = _prof([("reduce_scatter", 2, 4096, 8.0)])
    assert table_collective_time_s(prof, "reduce_scatter", 2, 1024) == pytest.approx(8e-6)
    assert table_collective_time_s(prof, "reduce_scatter", 2, 8192) == pytest.approx(16e-6)
    assert table_collective_time_s(prof, "reduce_scatter", 4, 8192) is None
    assert table_collective_time_s(prof, "all_reduce", 2, 8192) is None
    assert table_collective_time_s(None, "all_reduce", 2, 8192) is None


def test_repeated_sizes_are_averaged():
    prof = _prof([("all_reduce", 2, 1024, 10.0), ("all_reduce", 2, 1024, 20.0), ("all_reduce", 2, 4096, 30.0)])
    assert table_collective_time_s(prof, "all_reduce", 2, 1024) == pytest.approx(15e-6)
    assert math.isclose(table_collective_time_s(prof, "all_reduce", 2, 2048), 22.5e-6, rel_tol=1e-9)


def test_attention_efficiency_by_generation_unless_stated():
    """attention_rate.py's value per generation, 0.50 for a GPU without one; a scenario or profile value wins."""
    a = Attention(batch=1, heads=4 * 27 * 11 * 37, kv_heads=1, seq=128, head_dim=128)  # whole waves on 108/132/148 SMs
    for name, eff in (("h100-sxm", 0.43), ("h200-sxm", 0.43), ("b200", 0.55), ("gb200", 0.55 * 2250 / 2500),
                      ("a100-80gb", 0.5)):
        gpu = GPUS[name]
        model = ComputeModel(gpu)
        assert model.knobs.attention_efficiency == pytest.approx(eff, rel=1e-12)
        assert model.time_s(a) == pytest.approx(a.flops / (gpu.peak_tflops * 1e12 * eff) + 3e-6)
    stated = ComputeModel(H100, ComputeTuning(attention_efficiency=0.7))
    assert stated.knobs.attention_efficiency == 0.7
    prof = HardwareProfile(name="p", compute=ComputeTuning(attention_efficiency=0.6))
    assert ComputeModel(GPUS["b200"], None, prof).knobs.attention_efficiency == 0.6
    # the FP8 GEMM ceiling follows the same rule: the generation's value unless stated
    assert ComputeModel(H100).knobs.fp8_gemm_efficiency == 0.62
    assert ComputeModel(H100, ComputeTuning(fp8_gemm_efficiency=0.7)).knobs.fp8_gemm_efficiency == 0.7


def test_attention_rate_follows_the_head_width():
    """attention_rate.width_factor: per score w = 2 (d_qk + d_v) MMA FLOPs plus a width-free softmax, so the
    fraction of peak is w/512 (1 + rho) / (w/512 + rho) of head_dim 128's. Golden numbers: rho = 0.65 on an
    H100 ((1/16 + 5/128) cycles x 4096 x 0.8 / 512), 1.30 on a B200, 0.90 on a B300 (twice the exp rate)."""
    h100, b200, b300 = GPUS["h100-sxm"], GPUS["b200"], GPUS["b300"]
    assert softmax_to_mma(h100) == pytest.approx(0.65)
    assert softmax_to_mma(b200) == pytest.approx(1.30)
    assert softmax_to_mma(b300) == pytest.approx(0.90)
    assert width_factor(h100, 256) == pytest.approx(0.5 * 1.65 / 1.15)  # head_dim 64 (GPT-OSS)
    assert width_factor(b200, 640) == pytest.approx(1.25 * 2.3 / 2.55)  # MLA: 192 + 128
    for gpu in (h100, b200, b300):
        assert width_factor(gpu, 512) == 1.0  # the fitted width itself: unchanged
    custom = dataclasses.replace(h100, compute_capability=(0, 0))
    assert width_factor(custom, 256) == 1.0  # a part outside the tables: no correction
    # in the model: head_dim 64 does half the FLOPs of 128 in 0.5 / 0.717 = 0.70 of its time (not 0.5)
    wide = Attention(batch=1, heads=4 * 33, kv_heads=4, seq=4096, head_dim=128)
    narrow = dataclasses.replace(wide, head_dim=64)
    model = ComputeModel(h100)
    ratio = (model.time_s(narrow) - 3e-6) / (model.time_s(wide) - 3e-6)
    assert ratio == pytest.approx(0.5 / width_factor(h100, 256))
    mla = dataclasses.replace(wide, head_dim=192, v_head_dim=128)
    assert (model.time_s(mla) - 3e-6) / (model.time_s(wide) - 3e-6) == pytest.approx(1.25 / width_factor(h100, 640))


@pytest.mark.parametrize("shape", [(8192, 8192, 8192, 1), (4096, 2880, 5760, 1), (1024, 7168, 2048, 8),
                                   (128, 4096, 4096, 1), (16384, 131, 4096, 1), (8192, 28672, 8192, 1)])
def test_gb200_sustains_the_b200_die_rate(shape):
    """GB200 carries B200's die (reference_rate.py): unstated, every GEMM (16-bit and FP8, any shape: the
    epilogue's k_fill too) and every attention kernel takes B200's time, though its datasheet peak is 11%
    higher; MFU's peak stays its own. A stated ceiling is a fraction of GB200's own peak."""
    b200, gb200 = ComputeModel(GPUS["b200"]), ComputeModel(GPUS["gb200"])
    m, n, k, batch = shape
    for fp8 in (False, True):
        g = Gemm(m, n, k, batch=batch, fp8=fp8)
        assert gb200.time_s(g) == pytest.approx(b200.time_s(g), rel=1e-12)
    a = Attention(batch=batch, heads=32, kv_heads=8, seq=m, head_dim=128)
    assert gb200.time_s(a) == pytest.approx(b200.time_s(a), rel=1e-12)
    assert GPUS["gb200"].peak_tflops == 2500.0 and gb200.peak_flops == 2500e12
    g = Gemm(8192, 8192, 8192)
    stated = ComputeModel(GPUS["gb200"], ComputeTuning(gemm_efficiency=0.6, launch_overhead_us=0.0))
    assert stated.time_s(g) == pytest.approx(g.flops / (2500e12 * 0.6))


def test_a_part_of_its_own_die_is_not_scaled():
    """Negative control: a preset without `reference` keeps its own peak's fractions (H100 vs H200 differ)."""
    g = Gemm(8192, 8192, 8192)
    h100, h200 = ComputeModel(H100).time_s(g), ComputeModel(GPUS["h200-sxm"]).time_s(g)
    assert h100 == pytest.approx(g.flops / (989e12 * 0.68) + LAUNCH_S)
    assert h200 == pytest.approx(g.flops / (989e12 * 0.70) + LAUNCH_S)


def test_block_scaled_fp8_gemms_reach_a_fraction_of_the_per_tensor_ceiling():
    """fp8_gemm.py: blockwise (Hopper) and MXFP8 (Blackwell; blockwise runs as MXFP8 there) scale the FP8
    ceiling by the generation's block-scaled rate; per-tensor recipes and 16-bit GEMMs do not move; a stated
    FP8 ceiling is the recipe's own."""
    from meshsim.sim.cost.fp8_gemm import BLOCK_SCALED_RATE_BY_GPU

    g8, g16 = Gemm(8192, 8192, 8192, fp8=True), Gemm(8192, 8192, 8192)
    for gpu, recipes in ((H100, ("blockwise",)), (GPUS["b200"], ("mxfp8", "blockwise"))):
        rate = BLOCK_SCALED_RATE_BY_GPU[gpu.name.split("-")[0]]
        assert rate < 1.0
        per_tensor = ComputeModel(gpu, fp8_recipe="tensorwise")
        for recipe in recipes:
            blocked = ComputeModel(gpu, fp8_recipe=recipe)
            assert blocked.knobs.fp8_gemm_efficiency == pytest.approx(per_tensor.knobs.fp8_gemm_efficiency * rate)
            assert blocked.time_s(g8) - LAUNCH_S == pytest.approx((per_tensor.time_s(g8) - LAUNCH_S) / rate)
            assert blocked.time_s(g16) == per_tensor.time_s(g16)
    assert ComputeModel(H100, fp8_recipe="delayed").knobs.fp8_gemm_efficiency == 0.62
    stated = ComputeModel(H100, ComputeTuning(fp8_gemm_efficiency=0.7), fp8_recipe="blockwise")
    assert stated.knobs.fp8_gemm_efficiency == 0.7


def test_blackwell_ultra_parts_run_at_their_reference_rate():
    """B300 takes B200's constants at rate 1; GB300 at its fitted reference_rate (reference_rate.py): at the
    reference GEMM shape (no wave term: they have 160 SMs, B200 148) the time is B200's over that rate;
    by-generation lookups (NCCL's rows) fall back to B200's."""
    from meshsim.sim.cost.collectives.nccl_limits import generation
    from meshsim.topologies.gpus import GB300_REFERENCE_RATE

    b200 = ComputeModel(GPUS["b200"], ComputeTuning(launch_overhead_us=0.0))
    g, a = Gemm(8192, 8192, 8192), Attention(batch=1, heads=4 * 37, kv_heads=4, seq=4096, head_dim=128)
    for name, rate in (("b300", 1.0), ("gb300", GB300_REFERENCE_RATE)):
        part = ComputeModel(GPUS[name], ComputeTuning(launch_overhead_us=0.0))
        assert part.time_s(g) == pytest.approx(b200.time_s(g) / rate, rel=1e-12)
        g8 = Gemm(8192, 8192, 8192, fp8=True)  # the reference shape: no wave term (160 SMs against 148)
        assert part.time_s(g8) == pytest.approx(b200.time_s(g8) / rate, rel=1e-12)
        assert generation(name) == "blackwell"
    assert GB300_REFERENCE_RATE > 1.0
    assert ComputeModel(GPUS["gb300"]).time_s(a) < ComputeModel(GPUS["gb200"]).time_s(a)
