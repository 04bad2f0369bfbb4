"""The attention output Transformer Engine's FlashAttention 2 path keeps twice when a micro-batch holds more
than one sequence.

Megatron hands Transformer Engine its attention inputs as sbhd ([seq, batch, heads, head_dim]). TE's
FlashAttention backend runs FlashAttention 2 on bshd tensors and turns its output back (TE @e7c550c5, the
release of the Megatron CI's GB200 golden values, and @d0067d0: pytorch/attention/dot_product_attention/
backends.py, FlashAttention.forward, "(bs)hd -> bs(hd) -> sb(hd)"):

    output = output.view(batch_size, max_seqlen_q, -1).transpose(0, 1)
    return output.contiguous()

With batch 1 the transposed view is already contiguous and `.contiguous()` returns the same tensor; with
batch > 1 it is a copy. FlashAttention 2's autograd function keeps its own bshd output for the backward
(flash_attn_interface.py FlashAttnFunc.forward, ctx.save_for_backward(q, k, v, out, softmax_lse,
rng_state)) while linear_proj keeps the sbhd copy as its input, so each layer keeps one more attention
output per micro-batch: tokens x this rank's heads x head_dim x 2 bytes. cuDNN's fused attention
(FusedAttention) writes sbhd itself and keeps one.

Which backend runs (TE utils.py get_attention_backend @e7c550c5): below sm_90 FlashAttention is preferred
when both are available ("Select FusedAttention for performance" drops FlashAttention only on sm_90+), so
every 16-bit flash attention on an sm_8x part runs FlashAttention 2 (the NGC containers install it); on
sm_90+ TE runs it only where its deterministic filter leaves it (sim/cost/fa2_deterministic.uses_fa2: a
deterministic run with attention dropout on sm_100+). Not counted: context parallelism (TE's CP attention
functions hold their own per-step tensors), MLA (FlashAttention 2 needs equal Q/K and V widths), FP8
attention (cuDNN), and layers whose core attention is recomputed (nothing of it is kept).

Evidence (Megatron-LM @d98e8a64, tests/functional_tests/test_cases/gpt/gpt3_7b_*_memory_speed, golden
mem-max-allocated-bytes): tp 4, micro-batch 2, 32 layers: A100 58.19 GB and GB200 58.22 GB, both running
FlashAttention 2, against H100's 57.14 GB on cuDNN: +1.04 / +1.07 GB; the copy is 32 x 8,192 x 2 x 8 x 128 x 2
B = 1.074 GB. tp 1 pp 4, micro-batch 1 (no copy): A100 / GB200 0.23 / 0.20 GB below H100. Fitted on nothing.
"""

from __future__ import annotations

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.cost.fa2_deterministic import uses_fa2
from meshsim.sim.schedule.shapes import LayerDims
from meshsim.topologies.gpus import GpuSpec

HOPPER_MAJOR = 9  # sm_90: TE prefers cuDNN's fused attention from here on


def te_runs_fa2(gpu: GpuSpec, *, deterministic: bool, dropout: bool) -> bool:
    """Whether TE's attention on `gpu` is FlashAttention 2 (module docstring): sm_8x, or where the
    deterministic filter leaves it on sm_90+."""
    major = gpu.compute_capability[0]
    if major == HOPPER_MAJOR - 1:
        return True
    return major > HOPPER_MAJOR - 1 and deterministic and uses_fa2(gpu, dropout)


def keeps_core_attention(d: LayerDims) -> bool:
    """Whether a layer keeps its core attention's saved tensors for the backward (no recompute of it)."""
    return d.recompute == "none" or (d.recompute == "selective" and not d.recomputes("core_attn"))


def fa2_output_copy_bytes(rs: ResolvedScenario, d: LayerDims) -> int:
    """Bytes one attention layer keeps in addition for one micro-batch: the sbhd copy of FlashAttention 2's
    output, 0 where no copy is made or kept (module docstring)."""
    model, run = rs.scenario.model, rs.scenario.run
    if (not d.flash or d.micro_batch < 2 or d.cp > 1 or model.mla is not None or run.fp8_attention
            or not keeps_core_attention(d)):
        return 0
    if not te_runs_fa2(rs.gpu, deterministic=run.deterministic, dropout=d.dropout):
        return 0
    return d.tokens * d.heads * d.head_dim * d.dtype_bytes
