"""Transformer Engine's FlashAttention 2 path keeps a second copy of the attention output when a micro-batch
holds more than one sequence (sim/cost/fa2_memory.py): which runs make it, its size, and what it adds to
memory_per_gpu, with the Megatron CI gpt3 7B tp 4 shape as the golden number."""

from __future__ import annotations

import pytest

from meshsim.scenarios.load import resolve, validate_scenario
from meshsim.sim.cost.fa2_memory import fa2_output_copy_bytes, te_runs_fa2
from meshsim.sim.cost.memory import activation_bytes, memory_per_gpu
from meshsim.sim.schedule.shapes import layer_dims
from meshsim.topologies.gpus import GPUS

PRESETS = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "gb200": "gb200-nvl72"}


def make_rs(gpu: str, *, micro_batch: int = 2, deterministic: bool = True, dropout: bool = True,
            recompute: str = "none", cp: int = 1, layers: int = 2, hidden: int = 256, heads: int = 8,
            seq: int = 256, tp: int = 2):
    data = {"name": "fa2-copy", "model": {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq,
                                          "vocab": 1024, "mlp": "gelu", "dropout": dropout, "attention": "flash"},
            "hardware": {"gpu": gpu}, "topology": {"preset": PRESETS[gpu]},
            "parallel": {"tp": tp, "cp": cp, "dp": 1, "gpus": tp * cp, "micro_batch": micro_batch,
                         "global_batch": micro_batch, "recompute": recompute},
            "run": {"deterministic": deterministic}}
    return resolve(validate_scenario(data, "test"), "test")


def test_which_parts_run_flashattention_2():
    """sm_8x always (TE prefers FlashAttention below Hopper); sm_90 never (cuDNN stays, deterministic too);
    sm_100 only in a deterministic run with attention dropout (the filter drops cuDNN there)."""
    assert te_runs_fa2(GPUS["a100-80gb"], deterministic=False, dropout=False)
    assert not te_runs_fa2(GPUS["h100-sxm"], deterministic=True, dropout=True)
    assert te_runs_fa2(GPUS["gb200"], deterministic=True, dropout=True)
    assert not te_runs_fa2(GPUS["gb200"], deterministic=True, dropout=False)
    assert not te_runs_fa2(GPUS["gb200"], deterministic=False, dropout=True)
    assert not te_runs_fa2(GPUS["v100-sxm2"], deterministic=True, dropout=True)  # sm_70: no FlashAttention 2


def test_the_copy_is_this_ranks_attention_output_of_one_micro_batch():
    """tokens 2 x 256, heads 8 / tp 2 = 4, head_dim 32, 2 bytes: 131,072 B per layer."""
    rs = make_rs("gb200")
    assert fa2_output_copy_bytes(rs, layer_dims(rs)) == 2 * 256 * 4 * 32 * 2 == 131_072


@pytest.mark.parametrize("change", [
    {"micro_batch": 1},  # the transposed view is contiguous: no copy
    {"deterministic": False},  # cuDNN on Blackwell
    {"dropout": False},  # cuDNN keeps a deterministic backward without dropout
    {"recompute": "selective"},  # core attention recomputed: nothing of it is kept
    {"recompute": "full"},
    {"cp": 2},  # TE's context-parallel attention functions, not this path
])
def test_no_copy_where_te_makes_or_keeps_none(change):
    rs = make_rs("gb200", **change)
    assert fa2_output_copy_bytes(rs, layer_dims(rs)) == 0


def test_hopper_keeps_one_output_and_ampere_two():
    h100, a100 = make_rs("h100-sxm"), make_rs("a100-80gb", deterministic=False)
    assert fa2_output_copy_bytes(h100, layer_dims(h100)) == 0
    assert fa2_output_copy_bytes(a100, layer_dims(a100)) == 131_072


def test_megatron_ci_gpt3_7b_tp4_golden_difference():
    """The CI's tp 4 shape (32 layers, hidden 4,096, 32 heads, seq 8,192, micro-batch 2): GB200 (FA2) keeps
    32 x 8,192 x 2 x 8 x 128 x 2 B = 1,073,741,824 B more than H100 (cuDNN); the golden
    mem-max-allocated-bytes differ by 58,217,476,096 - 57,143,791,616 = 1,073,684,480 B."""
    kw = dict(layers=32, hidden=4096, heads=32, seq=8192, tp=4)
    gb200, h100 = make_rs("gb200", **kw), make_rs("h100-sxm", **kw)
    assert activation_bytes(gb200) - activation_bytes(h100) == 32 * 8192 * 2 * 8 * 128 * 2 == 1_073_741_824
    extra_gb = memory_per_gpu(gb200).activations_gb - memory_per_gpu(h100).activations_gb
    assert extra_gb == pytest.approx(1.073741824, rel=1e-9)
