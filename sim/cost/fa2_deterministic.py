"""FlashAttention-2's deterministic backward: one CTA per SM slice of the keys, and an fp32 dQ per slice.

Which kernel runs (Transformer Engine @d0067d0, pytorch/attention/dot_product_attention/utils.py, "Filter:
Determinism" and fused_attn.cpp, "determinism on Blackwell"): a deterministic backward
(NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, Megatron's --deterministic-mode) keeps cuDNN's fused attention on sm_90,
and on sm_100+ only without attention dropout; below sm_90 (its F16 arbitrary-seqlen path needs sm_90 for
determinism), and on sm_100+ with dropout, TE runs FlashAttention 2 (>= 2.4.1). `uses_fa2(gpu, dropout)`.

What FlashAttention 2 does then (Dao-AILab/flash-attention @0251105a, csrc/flash_attn/src/
flash_bwd_launch_template.h run_flash_bwd_seqk_parallel, flash_bwd_kernel.h compute_dq_dk_dv_seqk_parallel,
flash_api.cpp mha_bwd): the backward grid is (G, batch, heads) CTAs, CTA x looping over the key blocks
x, x + G, x + 2G, ... of its (batch, head). Without determinism G is the number of key blocks N (one
block per CTA, dQ accumulated with atomics into one fp32 buffer). With it,

    G = ceil(SMs / (batch x heads)),

so the whole kernel is about one CTA per SM, each adding into its own fp32 dQ slice: flash_api.cpp
allocates `torch::zeros({G, b, s_q rounded to 128, h, d rounded to 32})` and the convert kernel sums the G
slices. Two costs follow:

1. Load balance. With one CTA resident per SM (the hdim-128 kernel's 144 KB of shared memory is more than
   half of any SM's), CTAs start in launch order as SMs free up, and the kernel lasts as long as its
   most loaded SM. `split_ratio` list-schedules the deterministic grid and divides its makespan by the
   perfectly balanced time of the same work (total / SMs): 1.84 for the Megatron CI gpt3 7B tp4 case on an
   A100 (b 2, 8 heads: G = 7, so 112 CTAs on 108 SMs, a second wave of 4, each CTA 9-10 of 64 key blocks).
   A key block's work is the query tiles that see it (all of them, or the causal / windowed band).
2. Memory. The G slices are written twice (PyTorch's deterministic NaN fill of the fresh tensor, then the
   zeros) and read once by the convert kernel, where the default path clears and reads one buffer:
   (3 G - 2) x the slice bytes more (`extra_dq_bytes`), at the elementwise bandwidth.

Tile sizes per head width on parts with >= 144 KB of shared memory per block (A100, H100, B200;
run_mha_bwd_hdim*): (query rows, keys) 128 x 128 up to hdim 64, 64 x 128 up to 128, 64 x 64 above.
Fitted on nothing. The cuDNN deterministic backward (sm_90, sm_100 without dropout) is closed source and
keeps hardware.compute.deterministic_attention_slowdown (sim/schedule/run_settings.py).
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache

from meshsim.sim.core.units import FP32_BYTES
from meshsim.topologies.gpus import GpuSpec

CTAS_PER_SM = 1  # the backward kernel's shared memory allows one resident CTA (module docstring)


def uses_fa2(gpu: GpuSpec, dropout: bool) -> bool:
    """Whether TE's deterministic attention backward on `gpu` is FlashAttention 2 (module docstring)."""
    major = gpu.compute_capability[0]
    return major < 9 or (major >= 10 and dropout)


def backward_tiles(head_dim: int) -> tuple[int, int]:
    """(query rows, keys) per tile of FlashAttention 2's backward kernel at this head width."""
    if head_dim <= 64:
        return 128, 128
    return (64, 128) if head_dim <= 128 else (64, 64)


def splits(sm_count: int, batch: int, heads: int) -> int:
    """G: the deterministic grid's CTAs per (batch, head)."""
    return -(-sm_count // (batch * heads))


def key_block_work(seq_q: int, seq_kv: int, head_dim: int, causal: bool, window: int | None) -> tuple[int, ...]:
    """Query tiles that see each key block (causal: the queries are the last seq_q of seq_kv positions)."""
    tile_m, tile_n = backward_tiles(head_dim)
    m_blocks, offset = -(-seq_q // tile_m), seq_kv - seq_q
    work = []
    for j in range(-(-seq_kv // tile_n)):
        first_key, last_key = j * tile_n, min(seq_kv, (j + 1) * tile_n) - 1
        lo, hi = 0, m_blocks - 1
        if causal:  # a tile sees the block once its last query reaches the block's first key
            lo = max(lo, math.ceil((first_key - offset - (tile_m - 1)) / tile_m))
            if window is not None:  # ... and until its first query's window has left the block
                hi = min(hi, (last_key + window - 1 - offset) // tile_m)
        work.append(max(0, hi - lo + 1))
    return tuple(work)


@lru_cache(maxsize=4096)
def split_ratio(sm_count: int, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int,
                causal: bool, window: int | None) -> float:
    """The deterministic grid's makespan over total work / SMs (module docstring, 1); >= 1 up to round-off,
    1 when there is no work."""
    work = key_block_work(seq_q, seq_kv, head_dim, causal, window)
    g = splits(sm_count, batch, heads)
    per_cta = [sum(work[x::g]) for x in range(g)]
    total = sum(per_cta) * batch * heads
    if total == 0:
        return 1.0
    slots = [0.0] * min(sm_count * CTAS_PER_SM, g * batch * heads)
    for _ in range(batch * heads):  # launch order: x fastest, then batch, then head (all alike)
        for w in per_cta:
            heapq.heappush(slots, heapq.heappop(slots) + w)
    return max(slots) / (total / (sm_count * CTAS_PER_SM))


def extra_dq_bytes(sm_count: int, batch: int, heads: int, seq_q: int, head_dim: int) -> int:
    """(3 G - 2) fp32 dQ slices of batch x round_up(seq_q, 128) x heads x round_up(head_dim, 32)."""
    slice_bytes = batch * (-(-seq_q // 128) * 128) * heads * (-(-head_dim // 32) * 32) * FP32_BYTES
    return (3 * splits(sm_count, batch, heads) - 2) * slice_bytes
