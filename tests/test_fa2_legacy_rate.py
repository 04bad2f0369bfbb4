"""FlashAttention 2 on parts newer than sm_80 runs sm_80's mma.sync (sim/cost/attention_rate.py
legacy_mma_fraction): golden rates, and the calls of a deterministic run that take it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.sim.cost.attention_rate import (
    DEFAULT_ATTENTION_EFFICIENCY,
    DROPOUT_INT_OPS,
    dropout_factor,
    legacy_mma_fraction,
)
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.schedule.ops import Attention
from meshsim.topologies.gpus import GPUS


def test_legacy_mma_fraction_is_sm80_width_over_the_parts():
    assert legacy_mma_fraction(GPUS["a100-80gb"]) == 1.0
    assert legacy_mma_fraction(GPUS["v100-sxm2"]) == 1.0
    assert legacy_mma_fraction(GPUS["h100-sxm"]) == 0.5  # 2,048 / 4,096 FLOP per clock per SM
    assert legacy_mma_fraction(GPUS["gb200"]) == 0.25  # 2,048 / 8,192


def _forward() -> Attention:
    """8 heads x 37 query blocks = 296 CTAs = 2 full waves on 148 SMs (wave factor 1), head_dim 128."""
    return Attention(1, 8, 8, 128 * 37, 128, True, dropout=True)


def test_gb200_deterministic_forward_with_dropout_runs_fa2_at_a_quarter_of_the_b200_rate():
    """B200's absolute rate (GB200's own peak 2,500 x 0.9): FA2 2,250 TFLOP/s x 1/4 x 0.50 x its dropout
    factor 0.828125 (test_dropout_factor_golden_numbers) = 232.91 TFLOP/s."""
    det = ComputeModel(GPUS["gb200"], fill_uninitialized=True)
    a = _forward()
    fa2 = 2250e12 * 0.25 * DEFAULT_ATTENTION_EFFICIENCY * 0.828125
    assert det.fa2_rate_flops(a) == pytest.approx(fa2, rel=1e-12)
    assert det.time_s(a) - det.fill_s(a) == pytest.approx(a.flops / fa2 + det.launch_s, rel=1e-12)
    # negative controls: cuDNN at B200's 0.55 outside a deterministic run (dropout at native width: rho 1.3,
    # delta 1.1) and in one without dropout
    cudnn = 2250e12 * 0.55
    assert ComputeModel(GPUS["gb200"]).time_s(a) == pytest.approx(a.flops / (cudnn * 2.3 / 3.4) + det.launch_s,
                                                                  rel=1e-12)
    no_dropout = replace(a, dropout=False)
    assert det.time_s(no_dropout) - det.fill_s(no_dropout) == pytest.approx(no_dropout.flops / cudnn + det.launch_s,
                                                                            rel=1e-12)


def test_h100_keeps_cudnn_and_a100_keeps_its_native_fa2_rate():
    a = _forward()
    h100 = ComputeModel(GPUS["h100-sxm"], fill_uninitialized=True)
    assert not h100.runs_fa2(a)
    a100 = ComputeModel(GPUS["a100-80gb"], fill_uninitialized=True)
    assert a100.runs_fa2(a)
    assert a100.fa2_rate_flops(a) == pytest.approx(312e12 * a100.knobs.attention_efficiency * 1.45 / 1.725, rel=1e-12)


def test_dropout_factor_golden_numbers():
    """(1 + rho) / (1 + rho + delta) at head_dim 128; delta = 5.5 / 64 cycles x MMA FLOP/clk x 0.8 / 512.
    H100 (cuDNN, 4,096/clk): rho 0.65, delta 0.55 -> 0.75. A100 (2,048/clk): rho 0.45, delta 0.275 ->
    1.45 / 1.725. GB200 under FA2 (sm_80's 2,048/clk, FP32 128 lanes): rho 0.325, delta 0.275 -> 0.828125."""
    assert DROPOUT_INT_OPS == 5.5
    assert dropout_factor(GPUS["h100-sxm"], 512) == pytest.approx(0.75, rel=1e-12)
    assert dropout_factor(GPUS["a100-80gb"], 512) == pytest.approx(1.45 / 1.725, rel=1e-12)
    assert dropout_factor(GPUS["gb200"], 512, legacy=True) == pytest.approx(0.828125, rel=1e-12)
    assert dropout_factor(GPUS["h100-sxm"], 256) == pytest.approx((0.5 + 0.65) / (0.5 + 0.65 + 0.55), rel=1e-12)


def test_dropout_slows_h100_attention_by_its_factor_and_only_with_dropout():
    a = Attention(1, 8, 8, 128 * 33, 128, True, dropout=True)  # 264 CTAs = 2 waves on 132 SMs
    h100 = ComputeModel(GPUS["h100-sxm"])
    plain = h100.time_s(replace(a, dropout=False)) - h100.launch_s
    assert plain == pytest.approx(a.flops / (989e12 * 0.43), rel=1e-12)
    assert h100.time_s(a) - h100.launch_s == pytest.approx(plain / 0.75, rel=1e-12)


def test_gb200_fa2_rate_with_dropout():
    """2,250 TFLOP/s x 1/4 x 0.50 x 0.828125 = 232.91 TFLOP/s."""
    det = ComputeModel(GPUS["gb200"], fill_uninitialized=True)
    assert det.fa2_rate_flops(_forward()) == pytest.approx(2250e12 * 0.25 * 0.5 * 0.828125, rel=1e-12)
