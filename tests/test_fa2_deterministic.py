"""FlashAttention 2's deterministic backward (sim/cost/fa2_deterministic.py): which GPUs run it, its key
blocks' work, its grid's load balance and its fp32 dQ slices, by hand on small grids."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshsim.sim.cost.attention_rate import dropout_factor
from meshsim.sim.cost.compute import ComputeModel
from meshsim.sim.cost.fa2_deterministic import extra_dq_bytes, key_block_work, split_ratio, splits, uses_fa2
from meshsim.sim.schedule.ops import Attention
from meshsim.topologies.gpus import GPUS


def test_te_runs_fa2_below_sm90_and_on_blackwell_with_dropout_only():
    assert uses_fa2(GPUS["a100-80gb"], False) and uses_fa2(GPUS["a100-80gb"], True)
    assert not uses_fa2(GPUS["h100-sxm"], True) and not uses_fa2(GPUS["h200-sxm"], False)
    assert uses_fa2(GPUS["gb200"], True) and not uses_fa2(GPUS["gb200"], False)
    assert uses_fa2(GPUS["b300"], True) and not uses_fa2(GPUS["b300"], False)


def test_key_block_work_counts_the_query_tiles_that_see_each_block():
    """64-row query tiles, 128-key blocks at head_dim 128; 512 positions: 8 tiles, 4 blocks."""
    assert key_block_work(512, 512, 128, causal=False, window=None) == (8, 8, 8, 8)
    assert key_block_work(512, 512, 128, causal=True, window=None) == (8, 6, 4, 2)
    # a 128-key window: tile 3's first query (192) sees keys 65-192; tile 4's (256) sees none below 129
    assert key_block_work(512, 512, 128, causal=True, window=128) == (4, 4, 4, 2)
    # CP's bottom-right mask: 256 queries are the last of 512 keys, so every tile sees blocks 0-2
    assert key_block_work(256, 512, 128, causal=True, window=None) == (4, 4, 4, 2)
    assert key_block_work(512, 512, 64, causal=True, window=None) == (4, 3, 2, 1)  # 128-row tiles


def test_split_ratio_list_schedules_the_deterministic_grid():
    """4 SMs, 3 heads: G = 2, six CTAs. Without a mask each CTA has two blocks of 8 tiles (16): two waves,
    32 against 96 / 4 = 24. Causal (8, 6, 4, 2): CTAs of 12 and 8 alternate; the fifth (12) lands on an
    SM free at 8 and ends at 20, against 60 / 4 = 15. Both 4 / 3."""
    assert splits(4, 1, 3) == 2
    assert split_ratio(4, 1, 3, 512, 512, 128, False, None) == pytest.approx(4 / 3)
    assert split_ratio(4, 1, 3, 512, 512, 128, True, None) == pytest.approx(4 / 3)
    assert split_ratio(4, 1, 4, 512, 512, 128, False, None) == pytest.approx(1.0)  # G 1: one CTA per SM


def test_extra_dq_bytes_are_3g_minus_2_fp32_slices():
    """Megatron CI gpt3 7B tp4 on an A100: b 2, 8 heads, 8,192 tokens, G = ceil(108 / 16) = 7."""
    assert splits(108, 2, 8) == 7
    assert extra_dq_bytes(108, 2, 8, 8192, 128) == 19 * 2 * 8192 * 8 * 128 * 4
    assert extra_dq_bytes(108, 1, 1, 100, 80) == (3 * 108 - 2) * 128 * 96 * 4  # rounded to 128 and 32


def test_deterministic_backward_cost_on_fa2_and_on_cudnn():
    """On an A100 the deterministic backward is priced from FA2's grid (closed form); on an H100 (cuDNN)
    it runs cuDNN's dP-workspace path (tests/test_cudnn_deterministic.py); the forward and a non-deterministic backward ignore the dropout flag."""
    bwd = Attention(batch=2, heads=8, kv_heads=2, seq=8192, head_dim=128, backward=True, deterministic=True,
                    dropout=True)
    a100 = ComputeModel(GPUS["a100-80gb"])
    rate = a100.peak_flops * a100.knobs.attention_efficiency * dropout_factor(GPUS["a100-80gb"], 512)  # dropout 0.1
    expected = (bwd.flops * split_ratio(108, 2, 8, 8192, 8192, 128, True, None) / rate
                + extra_dq_bytes(108, 2, 8, 8192, 128) / a100.elementwise_bw_bytes_s + 3 * a100.launch_s)
    assert a100.time_s(bwd) == pytest.approx(expected, rel=1e-12)
    assert a100.time_s(bwd) > 1.5 * a100.time_s(replace(bwd, deterministic=False))
    plain = replace(bwd, deterministic=False)
    # outside determinism dropout changes no backend, only the rate (attention_rate.dropout_factor)
    no_dropout = a100.time_s(replace(plain, dropout=False)) - a100.launch_s
    assert a100.time_s(plain) - a100.launch_s == pytest.approx(no_dropout / dropout_factor(GPUS["a100-80gb"], 512))
    h100 = ComputeModel(GPUS["h100-sxm"])
    assert h100.time_s(bwd) > 1.25 * h100.time_s(plain)  # no FA2 grid: cudnn_deterministic.py
    gb200 = ComputeModel(GPUS["gb200"])
    assert gb200.time_s(bwd) > gb200.time_s(replace(bwd, dropout=False))  # FA2 with dropout, cuDNN without
