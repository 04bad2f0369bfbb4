"""The GEMM ceiling at two clocks (sim/cost/gemm_ceiling.py): a training step's sustained one, the default, and
a lone kernel's burst one; closed-form golden numbers at the 8192^3 reference shape, where the efficiency is
the ceiling exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshsim.scenarios.schema import ComputeTuning
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.gemm_ceiling import BURST, SUSTAINED, gemm_ceiling, gemm_ceilings
from meshsim.sim.schedule.ops import Attention, Gemm
from meshsim.topologies.gpus import GPUS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from accuracy_cases import KernelCase  # noqa: E402
from accuracy_rows import flux_gemm_s  # noqa: E402

NO_LAUNCH = ComputeTuning(launch_overhead_us=0.0)
REF = Gemm(8192, 8192, 8192)


def tflops(gpu: str, clock, g: Gemm = REF) -> float:
    return g.flops / ComputeModel(GPUS[gpu], NO_LAUNCH, clock=clock).time_s(g) / 1e12


@pytest.mark.parametrize(("gpu", "sustained", "burst"), [
    ("h100-sxm", 989 * 0.68, 989 * 0.78),      # 672.52 / 771.42 TFLOP/s
    ("a100-80gb", 312 * 0.78, 312 * 0.85),     # 243.36 / 265.2
    ("h200-sxm", 989 * 0.70, 989 * 0.80),      # 0.80 measured alone, x H100's 0.68 / 0.78 = 0.697 -> 0.70
])
def test_the_reference_gemm_runs_at_each_clocks_ceiling(gpu, sustained, burst):
    assert tflops(gpu, SUSTAINED) == pytest.approx(sustained, rel=1e-12)
    assert tflops(gpu, BURST) == pytest.approx(burst, rel=1e-12)
    assert ComputeModel(GPUS[gpu]).clock == SUSTAINED  # the default: scenarios are training steps


def test_sustained_clock_is_the_ratio_of_the_two_figures():
    assert gemm_ceilings("h100-sxm").sustained_clock == pytest.approx(0.68 / 0.78, rel=1e-12)  # 0.872
    assert gemm_ceilings("a100-40gb").sustained_clock == pytest.approx(0.78 / 0.85, rel=1e-12)  # 0.918
    assert gemm_ceiling("h200-sxm") == round(0.80 * 0.68 / 0.78, 2) == 0.70


def test_burst_divides_the_training_fitted_fp8_and_attention_rates_by_the_clock():
    """FP8 (0.62) and attention (0.43) were fitted on training steps: sustained figures; a lone kernel runs them
    at 1 / sustained_clock = 0.78 / 0.68 of that."""
    h100 = GPUS["h100-sxm"]
    sustained = ComputeModel(h100, NO_LAUNCH)
    burst = ComputeModel(h100, NO_LAUNCH, clock=BURST)
    assert sustained.knobs.fp8_gemm_efficiency == pytest.approx(0.62, rel=1e-12)
    assert burst.knobs.fp8_gemm_efficiency == pytest.approx(0.62 * 0.78 / 0.68, rel=1e-12)  # 0.7112
    fp8 = Gemm(8192, 8192, 8192, fp8=True)
    assert fp8.flops / burst.time_s(fp8) / 1e12 == pytest.approx(1979 * 0.62 * 0.78 / 0.68, rel=1e-12)
    assert burst.knobs.attention_efficiency == pytest.approx(0.43 * 0.78 / 0.68, rel=1e-12)
    a = Attention(batch=1, heads=132, kv_heads=8, seq=4096, head_dim=128)  # one full wave of 32-block CTAs
    assert sustained.time_s(a) / burst.time_s(a) == pytest.approx(0.78 / 0.68, rel=1e-12)


def test_a_gpu_no_row_tells_apart_runs_alike_at_both_clocks():
    """Negative control: Blackwell's 0.60 (a training row) and V100's default have no burst figure: clock 1;
    GB200 takes B200's pair through its reference."""
    for gpu in ("b200", "gb200", "v100-sxm2"):
        assert tflops(gpu, BURST) == pytest.approx(tflops(gpu, SUSTAINED), rel=1e-12)
        assert ComputeModel(GPUS[gpu], clock=BURST).knobs == ComputeModel(GPUS[gpu]).knobs
    assert tflops("b200", BURST) == pytest.approx(2250 * 0.60, rel=1e-12)


def test_a_stated_ceiling_is_the_scenarios_at_either_clock():
    """Negative control: hardware.compute.gemm_efficiency is the scenario's own figure and is not moved."""
    stated = ComputeTuning(gemm_efficiency=0.6, fp8_gemm_efficiency=0.5, launch_overhead_us=0.0)
    for clock in (SUSTAINED, BURST):
        model = ComputeModel(GPUS["h100-sxm"], stated, clock=clock)
        assert REF.flops / model.time_s(REF) / 1e12 == pytest.approx(989 * 0.6, rel=1e-12)
        assert model.knobs.fp8_gemm_efficiency == 0.5


def test_fluxs_all_gather_baseline_adds_its_output_multiply():
    """FLUX's all-gather row times alpha_scale * matmul (bytedance/flux @239a13d2 test/test_ag_kernel.py
    L118-145): the multiply reads and writes the 4096 x 6144 fp16 output, 100,663,296 B at 3,350 GB/s x 0.65
    plus a 3 us launch = 49.23 us on an H800; the reduce-scatter row (no multiply) is the GEMM alone."""
    row = KernelCase("ag", "ag", "h100-sxm", "dgx-h100", 0.846, (4096, 6144, 12288), scaled_output=True)
    plain = KernelCase("rs", "rs", "h100-sxm", "dgx-h100", 0.846, (4096, 6144, 12288))
    model = ComputeModel(GPUS["h100-sxm"], clock=BURST)
    multiply_s = flux_gemm_s(row, model) - flux_gemm_s(plain, model)
    assert multiply_s == pytest.approx(4 * 4096 * 6144 / (3350e9 * 0.65) + 3e-6, rel=1e-12)
    assert multiply_s * 1e6 == pytest.approx(49.23, abs=0.01)
    assert flux_gemm_s(plain, model) == pytest.approx(model.time_s(Gemm(4096, 6144, 12288)), rel=1e-15)
