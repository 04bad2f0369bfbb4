"""FlashAttention 2 on parts newer than sm_80 runs sm_80's mma.sync (sim/cost/attention_rate.py
legacy_mma_fraction): golden rates, and the calls of a deterministic run that take it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.sim.cost.attention_rate import DEFAULT_ATTENTION_EFFICIENCY, legacy_mma_fraction
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
    """B200's absolute rate: 2,250 TFLOP/s x 1/4 x 0.50 = 281.25 TFLOP/s (GB200's own peak 2,500 x 0.9)."""
    det = ComputeModel(GPUS["gb200"], fill_uninitialized=True)
    a = _forward()
    assert det.fa2_rate_flops(a) == pytest.approx(2250e12 * 0.25 * DEFAULT_ATTENTION_EFFICIENCY, rel=1e-12)
    assert det.time_s(a) - det.fill_s(a) == pytest.approx(a.flops / 281.25e12 + det.launch_s, rel=1e-12)
    # negative controls: cuDNN without dropout or outside a deterministic run, at B200's 0.55
    cudnn = a.flops / (2250e12 * 0.55) + det.launch_s
    assert ComputeModel(GPUS["gb200"]).time_s(a) == pytest.approx(cudnn, rel=1e-12)
    no_dropout = replace(a, dropout=False)
    assert det.time_s(no_dropout) - det.fill_s(no_dropout) == pytest.approx(cudnn, rel=1e-12)


def test_h100_keeps_cudnn_and_a100_keeps_its_native_fa2_rate():
    a = _forward()
    h100 = ComputeModel(GPUS["h100-sxm"], fill_uninitialized=True)
    assert not h100.runs_fa2(a)
    a100 = ComputeModel(GPUS["a100-80gb"], fill_uninitialized=True)
    assert a100.runs_fa2(a)
    assert a100.fa2_rate_flops(a) == pytest.approx(312e12 * a100.knobs.attention_efficiency, rel=1e-12)
