"""validate's FP8 emulation on CPU (torch float8 dtypes) against float64, with negative controls, and the
guard of the GPU FP8 GEMM calibration (which cannot run here)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # meshsim[validate]: the module is skipped, not an error, without it

from meshsim.scenarios.load import load_scenario  # noqa: E402
from meshsim.sim.core.errors import CommandFailed  # noqa: E402
from meshsim.validate.calibrate import fp8_gemm  # noqa: E402
from meshsim.validate.numerics.fp8_emulation import (  # noqa: E402
    FP8_TOLERANCE,
    AmaxHistory,
    check_fp8_mlp,
    check_fp8_run,
    quantize,
    without_fp8,
)

RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fmt", ("hybrid", "e4m3"))
def test_fp8_mlp_matches_float64_within_fp8_tolerance(recipe, fmt):
    assert check_fp8_mlp(recipe, fmt) <= FP8_TOLERANCE


@pytest.mark.parametrize("recipe", RECIPES)
def test_wrong_scale_fails(recipe):
    """Negative control: dequantizing with twice the scale halves every FP8 operand."""
    assert check_fp8_mlp(recipe, scale_error=2.0) > FP8_TOLERANCE


def test_tensorwise_scale_maps_the_amax_to_the_fp8_max():
    x = torch.tensor([[0.5, -3.0, 1.0, 2.0]], dtype=torch.float64)
    q = quantize(x, "e4m3", "tensorwise")
    assert float(q[0, 1]) == pytest.approx(-3.0, rel=1e-6)  # the amax maps onto 448 = the E4M3 max (fp32 scale)
    assert torch.allclose(q, x, rtol=2**-4)


def test_delayed_scaling_uses_the_history_not_the_current_amax():
    """Delayed: the first step runs at TE's initial scale 1.0; later steps at fp8_max / max(history). A tensor
    that grew past the history's amax saturates (the cost of delay), which tensorwise avoids."""
    h = AmaxHistory(length=2, algo="max")
    small = torch.full((1, 4), 0.25, dtype=torch.float64)
    assert torch.equal(quantize(small, "e4m3", "delayed", history=h), small)  # scale 1: 0.25 is exact
    quantize(small * 2, "e4m3", "delayed", history=h)
    assert h.values == [0.5, 0.25] and h.amax() == 0.5
    big = torch.full((1, 4), 4.0, dtype=torch.float64)
    got = quantize(big, "e4m3", "delayed", history=h)  # scale = 448 / 0.5: 4.0 x 896 saturates at 448
    assert torch.allclose(got, torch.full((1, 4), 0.5, dtype=torch.float64))
    assert h.values == [4.0, 0.5]  # the window keeps the last two amaxes
    assert torch.allclose(quantize(big, "e4m3", "tensorwise"), big)


def test_mxfp8_scales_each_32_value_block_by_a_power_of_two():
    x = torch.ones(1, 64, dtype=torch.float64)
    x[0, 32:] = 1000.0  # the second block alone: E4M3 cannot hold 1000 unscaled, its own E8M0 scale can
    q = quantize(x, "e4m3", "mxfp8")
    assert torch.equal(q[0, :32], x[0, :32]) and torch.allclose(q[0, 32:], x[0, 32:], rtol=2**-4)


def test_check_run_reports_and_scenario_without_fp8():
    sc, _ = load_scenario("llama3-8b-h100-fp8")
    ok, lines = check_fp8_run(sc.run)
    assert ok and "fails, as it must" in lines[1]
    assert sc.run.fp8 == "tensorwise" and without_fp8(sc).run.fp8 == "off"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU guard")
def test_fp8_gemm_calibration_refuses_without_a_gpu():
    with pytest.raises(CommandFailed):
        fp8_gemm.measure()
    assert fp8_gemm.main([]) == 1


def test_nvfp4_round_trip_has_two_levels_of_scale_and_the_e2m1_grid():
    """A block of 16 whose amax is the tensor's maps onto 6 x its E4M3-stored scale: exact E2M1 multiples
    come back exactly, a value between two grid points goes to the nearer; a second block with a 100x
    smaller amax keeps its own resolution (its own block scale), which one tensor scale could not."""
    from meshsim.validate.numerics.fp8_emulation import E2M1_VALUES, NVFP4_TOLERANCE, nvfp4_round_trip

    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :8] = torch.tensor(E2M1_VALUES)
    x[0, 8] = 2.4  # between 2 and 3: to 2
    x[0, 16:24] = torch.tensor(E2M1_VALUES) / 100
    q = nvfp4_round_trip(x.float())
    assert torch.allclose(q[0, :8], x[0, :8], rtol=1e-6) and float(q[0, 8]) == pytest.approx(2.0)
    assert torch.allclose(q[0, 16:24], x[0, 16:24], rtol=2**-3)  # E4M3 block scale: 3 mantissa bits
    assert check_fp8_mlp("nvfp4") <= NVFP4_TOLERANCE < check_fp8_mlp("nvfp4", scale_error=2.0)
    assert check_fp8_mlp("nvfp4") > FP8_TOLERANCE  # half a byte is coarser than FP8: its own bound


def test_check_run_emulates_nvfp4():
    sc, _ = load_scenario("llama3-8b-h100-fp8")
    ok, lines = check_fp8_run(sc.run.model_copy(update={"fp8": "nvfp4"}))
    assert ok and lines[0].startswith("NVFP4") and "fails, as it must" in lines[1]
